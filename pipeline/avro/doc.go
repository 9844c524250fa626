// Package avro is onceflow's Avro adapter: the Confluent wire format, schema
// registries (an embedded one and a client for a real one) and Serde, which
// turns typed Go values into framed Avro and back.
//
// # Wire format
//
// Every record value is framed as Confluent's serializers frame it
// (docs/consumers.md#values-wire-format-subjects-and-schema-ids): byte 0 is the
// magic 0, bytes 1..4 the schema id (big-endian), then the Avro binary encoding
// of one datum. AppendHeader and ParseHeader handle the frame; Serde does the
// rest. Subjects follow TopicNameStrategy ("{topic}-value", see ValueSubject).
//
// # Schema resolution
//
// goavro decodes with one schema; it does not resolve a writer's schema
// against a reader's. But Kafka keeps records for years, written by
// binaries built with older (or newer) schemas, so a reader must decode
// with the writer's schema (found by the id in the header, fetched once
// per id and cached with its codec) and then bring the datum to its own
// schema. Serde.Decode does that resolution, following the Avro
// specification:
//
//   - records match by name; a field the writer lacks takes the reader's
//     default (no default: the writer schema is incompatible); a field the
//     reader lacks is dropped; reader field aliases are honoured;
//   - union branches match by full name; data in a branch the reader lacks
//     fails with "unknown type X" (only when such data is read);
//   - promotions int -> long/float/double, long -> float/double,
//     float -> double, string <-> bytes;
//   - arrays, maps, fixed (same name and size), enums (an unknown symbol
//     takes the reader's default, else fails), unions with null.
//
// Decode errors are classified so a consumer can route a poison record to
// its DLQ with a reason and never block its partition: ErrMalformed (bad
// header, undecodable bytes, trailing bytes; also a decoder panic,
// recovered), ErrUnknownSchema (an id the registry does not know),
// ErrIncompatible (a writer schema or branch this binary cannot read).
// Anything else (registry unreachable, context done) is transient.
//
// # Go types
//
// A Serde maps Go structs to records by `avro:"name"` tags (else the
// snake_case of the field name). Supported: string, []byte, bool, int32,
// int64, int, float32, float64, pipeline.ID and [16]byte (Avro fixed of
// size 16, or string holding a canonical UUID), time.Time (long with
// logicalType timestamp-millis or timestamp-micros), slices (arrays), maps
// with string keys, nested structs (records), pointers (unions with null)
// and interfaces (unions of records whose Go types are registered).
// NewSerde checks the Go types against the schema, so a mismatch stops the
// binary at start instead of failing on the first record.
//
// # Limits
//
// A record is untrusted input. goavro's process-wide limits are set in this
// package's init (see limits.go): at most 2^18 items per array or map
// block, so a claim of 2^40 items fails before allocating, and at most
// 4 MiB (array) or about 20 MiB (map) is allocated for a claim the bytes
// cannot back; string and bytes lengths are checked against the input
// before anything is allocated. Schemas that would let a small payload
// grow without bound are refused: recursive types (nesting as deep as the
// payload is long exhausts the stack, which is fatal) and arrays of
// zero-width items (null, empty records).
//
// # Registries
//
// Registry is the small interface Serde needs: Register (id of a schema
// under a subject, registering it if new) and SchemaByID. Embedded keeps
// schemas in memory (`onceflow dev`, tests), or in a file with
// OpenEmbedded, so ids survive a restart of what holds the records; its
// ids start at 1 and are global across subjects, and it compares schemas
// in a normalized JSON form (whitespace and key order do not matter; docs,
// defaults and logical types do). Embedded.Handler serves it over HTTP as
// the subset of Confluent's REST API that clients use (schemas by id,
// subjects, versions, register, lookup, compatibility, config), so
// franz-go's sr client, kcat -s avro and Confluent serializers work against
// the dev stack. Client is a Registry over a real Confluent-compatible
// registry (SCHEMA_REGISTRY_URL) through franz-go's sr package, caching ids
// and schemas forever (they are immutable).
//
// # Compatibility
//
// A schema new to a subject must be compatible with its earlier versions
// under the subject's compatibility level, with Confluent's meanings:
// BACKWARD by default (the new version reads records written with the
// latest: fields added with defaults, no union branch removed, promotions
// only), FORWARD, FULL, their _TRANSITIVE forms, or NONE. Embedded checks
// it itself by the resolution rules above (compat.go) and refuses with an
// *IncompatibleError (ErrIncompatibleSchema) naming each record and field
// at fault; Client asks the registry's compatibility endpoint before it
// registers and refuses the same way with the registry's reasons. A
// schema the subject already has (an older binary during a rolling
// upgrade) is never refused.
package avro
