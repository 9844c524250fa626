#!/usr/bin/env python3
"""Consume onceflow's {prefix}.events the way docs/consumers.md says, with
clients that share no code with onceflow: librdkafka (Debian's
python3-confluent-kafka) and Apache Avro (python3-avro).

It reads the topic from the start in a consumer group, read_committed,
decodes every value by the writer's schema id (Confluent wire format, the
schema fetched from the registry over HTTP), drops events whose event-id it
has already seen, prints one JSON object per event in the order it read
them, commits its offsets and exits once it has reached the end of every
partition.

usage: consume.py --brokers HOST:PORT --registry URL --topic ledger.events --group NAME
"""

import argparse
import io
import json
import struct
import sys
import time
import urllib.request

import avro.io
import avro.schema
from confluent_kafka import Consumer, KafkaError, KafkaException


def murmur2(data):
    """Kafka's murmur2, as its default partitioner hashes a key."""
    m, r = 0x5BD1E995, 24
    h = (0x9747B28C ^ len(data)) & 0xFFFFFFFF
    n = len(data) // 4
    for i in range(n):
        k = data[4 * i] | data[4 * i + 1] << 8 | data[4 * i + 2] << 16 | data[4 * i + 3] << 24
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    rest, tail = len(data) % 4, 4 * n
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


class Registry:
    """Writer schemas by id, fetched once from a Confluent-compatible registry."""

    def __init__(self, url):
        self.url = url.rstrip("/")
        self.schemas = {}

    def schema(self, schema_id):
        if schema_id not in self.schemas:
            with urllib.request.urlopen(f"{self.url}/schemas/ids/{schema_id}", timeout=10) as resp:
                self.schemas[schema_id] = avro.schema.parse(json.load(resp)["schema"])
        return self.schemas[schema_id]


def decode(registry, value):
    """Decodes a Confluent-framed Avro value: byte 0, the schema id (4 bytes,
    big-endian), then the Avro binary encoding under that (the writer's)
    schema. The events schema is a union of records: the branch index comes
    first, and the branch's name is the event type."""
    if value is None or len(value) < 5 or value[0] != 0:
        raise ValueError("not Confluent wire format")
    schema_id = struct.unpack(">I", value[1:5])[0]
    writer = registry.schema(schema_id)
    payload = io.BytesIO(value[5:])
    decoder = avro.io.BinaryDecoder(payload)
    branch = writer
    if isinstance(writer, avro.schema.UnionSchema):
        branch = writer.schemas[decoder.read_long()]
    datum = avro.io.DatumReader(branch).read(decoder)
    if payload.read(1):
        raise ValueError("bytes left after the datum")
    return schema_id, branch.fullname, datum


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--brokers", required=True)
    ap.add_argument("--registry", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--timeout", type=float, default=60)
    args = ap.parse_args()

    consumer = Consumer({
        "bootstrap.servers": args.brokers,
        "group.id": args.group,
        # Never see the records of aborted transactions (librdkafka's
        # default; Java's and franz-go's is read_uncommitted).
        "isolation.level": "read_committed",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
    })
    registry = Registry(args.registry)
    partitions = len(consumer.list_topics(args.topic, timeout=10).topics[args.topic].partitions)
    assigned, at_end = set(), set()

    def on_assign(c, tps):
        assigned.update(tp.partition for tp in tps)

    consumer.subscribe([args.topic], on_assign=on_assign)
    seen, duplicates, read = set(), 0, 0
    deadline = time.time() + args.timeout
    try:
        while not assigned or at_end != assigned:
            if time.time() > deadline:
                raise SystemExit(f"not at the end of every partition after {args.timeout}s: {sorted(at_end)} of {sorted(assigned)}")
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    at_end.add(msg.partition())
                    continue
                raise KafkaException(msg.error())
            at_end.discard(msg.partition())
            read += 1
            headers = {k: v.decode() for k, v in (msg.headers() or [])}
            event_id = headers["event-id"]
            if event_id in seen:  # at-least-once delivery, a replay: apply each event once
                duplicates += 1
                continue
            seen.add(event_id)
            schema_id, record, value = decode(registry, msg.value())
            key = msg.key()
            print(json.dumps({
                "event_id": event_id,
                "event_type": headers["event-type"],
                "command_id": headers["command-id"],
                "aggregate_version": int(headers["aggregate-version"]),
                "tenant": headers["tenant"],
                "command_type": headers.get("command-type"),
                "traceparent": headers.get("traceparent"),
                "key": key.decode(),
                "partition": msg.partition(),
                "key_partition": (murmur2(key) & 0x7FFFFFFF) % partitions,
                "offset": msg.offset(),
                "timestamp_ms": msg.timestamp()[1],
                "schema_id": schema_id,
                "record": record,
                "value": value,
            }), flush=True)
        if read:
            consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    print(json.dumps({"read": read, "events": len(seen), "duplicates": duplicates}), file=sys.stderr)


if __name__ == "__main__":
    main()
