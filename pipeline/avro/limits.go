package avro

import "github.com/linkedin/goavro/v2"

// Limits on what a hostile payload can make the decoder allocate. Values are
// Kafka records, a megabyte by default (the broker's message.max.bytes);
// goavro's defaults (math.MaxInt32 for both) would let a few bytes claim
// gigabytes.
//
// What goavro bounds, read from its v2.15.0 source:
//
//   - MaxBlockCount bounds the item count of one block of an array or map.
//     goavro allocates for the whole count up front (make([]any, 0, count),
//     make(map[string]any, count)) before reading a single item. At 1<<18 the
//     worst up-front allocation for a claim that the bytes cannot back is
//     4 MiB for an array and about 20 MiB for a map (Go 1.26; measured by
//     TestBlockCountClaimAtLimit). Every array or map item takes at least one
//     byte (arrays of zero-width items are refused, see schema.zeroWidth), so
//     a block of a 1 MiB record that holds more than 262,144 items needs
//     items under 4 bytes; goavro's and this package's encoder split longer
//     arrays into blocks of at most MaxBlockCount, so what we write we read.
//   - MaxBlockSize bounds the byte size of an OCF (container file) block and
//     of the bytes values in an OCF header. It does not apply to single
//     datums: there goavro checks a bytes or string length against the
//     remaining input before slicing it, so a string claiming 2^40 bytes
//     fails without allocating. This package does not read OCF; the bound
//     is set for any OCF reader in the same process.
//
// These are process-wide variables of goavro; this package owns them because
// it is the only importer of goavro in onceflow.
const (
	maxBlockCount = 1 << 18 // items per array or map block
	maxBytes      = 1 << 20 // bytes per OCF block; size of a fixed
)

func init() {
	goavro.MaxBlockCount = maxBlockCount
	goavro.MaxBlockSize = maxBytes
}
