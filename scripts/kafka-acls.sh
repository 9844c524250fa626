#!/bin/sh
# The Kafka ACLs of one onceflow deployment, a principal per component:
# each may do what its role needs and nothing else
# (docs/security.md#kafka-acls, where the table says why each is there).
# Run it once, as a Kafka user allowed to create ACLs, with the brokers
# running StandardAuthorizer (KRaft) and no allow.everyone.if.no.acl.found:
#
#   BOOTSTRAP=kafka:9092 COMMAND_CONFIG=admin.properties PREFIX=ledger \
#   PROCESSOR_GROUP=onceflow-processor PROJECTOR_GROUP=onceflow-projector \
#   scripts/kafka-acls.sh
#
#   BOOTSTRAP        the brokers (required)
#   COMMAND_CONFIG   the admin's client properties: security.protocol,
#                    sasl.mechanism, sasl.jaas.config, truststore (required)
#   PREFIX           the topic prefix (ONCEFLOW_TOPIC_PREFIX; default the
#                    domain's name): the topics are PREFIX.commands,
#                    .events, .state, .commands.dlq and .dedup
#   PROCESSOR_GROUP  the processor's consumer group; its transactional ids
#                    are PROCESSOR_GROUP-{instance id}. Default
#                    onceflow-processor-PREFIX (a domain's Aggregate.Group;
#                    the ledger's is onceflow-processor)
#   PROJECTOR_GROUP  the projector's consumer group. Default
#                    onceflow-projector-PREFIX (a domain's Consumer; the
#                    ledger's is onceflow-projector)
#   RELAY_TXN        the relay's transactional ids' prefix. Default
#                    onceflow-relay-PREFIX- (shard s is ...-s)
#   RELAY PROCESSOR PROJECTOR OPERATOR LAG
#                    the principals. Default User:relay, User:processor, ...
#   KAFKA_ACLS       Apache Kafka's kafka-acls tool. Default kafka-acls.sh
#
# ingest and worker get nothing: they never talk to Kafka. A domain of
# several aggregate types has a commands topic each (PREFIX.TYPE.commands):
# run it once per aggregate type with PREFIX=PREFIX.TYPE and that type's
# PROCESSOR_GROUP, and RELAY_TXN the domain's.
set -eu

: "${BOOTSTRAP:?the brokers}" "${COMMAND_CONFIG:?the admin client properties}"
PREFIX=${PREFIX:-ledger}
PROCESSOR_GROUP=${PROCESSOR_GROUP:-onceflow-processor-$PREFIX}
PROJECTOR_GROUP=${PROJECTOR_GROUP:-onceflow-projector-$PREFIX}
RELAY_TXN=${RELAY_TXN:-onceflow-relay-$PREFIX-}
RELAY=${RELAY:-User:relay}
PROCESSOR=${PROCESSOR:-User:processor}
PROJECTOR=${PROJECTOR:-User:projector}
OPERATOR=${OPERATOR:-User:operator}
LAG=${LAG:-User:lag}

acls() {
	"${KAFKA_ACLS:-kafka-acls.sh}" --bootstrap-server "$BOOTSTRAP" --command-config "$COMMAND_CONFIG" --add --force "$@"
}

# Every component that uses Kafka, and the operator, checks at start that
# the topics exist with their cleanup policies; the lag exporter lists
# their offsets.
acls --allow-principal "$RELAY" --allow-principal "$PROCESSOR" --allow-principal "$PROJECTOR" --allow-principal "$OPERATOR" \
	--allow-principal "$LAG" --operation Describe --operation DescribeConfigs --resource-pattern-type prefixed --topic "$PREFIX."

# relay: ships the outbox to the commands topic in transactions of its own.
acls --allow-principal "$RELAY" --operation Write --topic "$PREFIX.commands"
acls --allow-principal "$RELAY" --operation Write --resource-pattern-type prefixed --transactional-id "$RELAY_TXN"

# processor: reads the commands in its group; writes events, snapshots,
# its dedup changelog, dead letters and the commands its decisions send,
# in transactions of its own; restores from state and dedup.
acls --allow-principal "$PROCESSOR" --operation Read --topic "$PREFIX.commands" --topic "$PREFIX.state" --topic "$PREFIX.dedup"
acls --allow-principal "$PROCESSOR" --operation Write --topic "$PREFIX.commands" --topic "$PREFIX.events" --topic "$PREFIX.state" \
	--topic "$PREFIX.dedup" --topic "$PREFIX.commands.dlq"
acls --allow-principal "$PROCESSOR" --operation Read --group "$PROCESSOR_GROUP"
acls --allow-principal "$PROCESSOR" --operation Write --resource-pattern-type prefixed --transactional-id "$PROCESSOR_GROUP-"

# projector: reads the events in its group (the offsets that count are in
# Postgres; the group's are a copy for lag monitoring).
acls --allow-principal "$PROJECTOR" --operation Read --topic "$PREFIX.events"
acls --allow-principal "$PROJECTOR" --operation Read --group "$PROJECTOR_GROUP"

# operator (the onceflow CLI): topics create; produce, dlq redrive and
# reconcile write commands; dlq list, projections rebuild and trace read;
# lag describes the groups (with the lag exporter, below).
acls --allow-principal "$OPERATOR" --operation Create --resource-pattern-type prefixed --topic "$PREFIX."
acls --allow-principal "$OPERATOR" --operation Write --topic "$PREFIX.commands"
acls --allow-principal "$OPERATOR" --operation Read --topic "$PREFIX.commands" --topic "$PREFIX.commands.dlq" --topic "$PREFIX.events"

# lag (`onceflow lag -serve`, the exporter that runs alone for the whole
# cluster; the operator's `lag` too): describes the groups and reads
# their committed offsets and, for the lag in seconds, the first record
# each has not read.
acls --allow-principal "$OPERATOR" --allow-principal "$LAG" --operation Describe --group "$PROCESSOR_GROUP" --group "$PROJECTOR_GROUP"
acls --allow-principal "$LAG" --operation Read --topic "$PREFIX.commands" --topic "$PREFIX.events"
