package pipeline

import (
	"strings"
	"unicode"
)

// Printable is s made safe to print in a terminal or a log line when it
// came from outside (a receiver's answer, a transport's error quoting
// one): invalid UTF-8 becomes '?', line breaks and tabs become spaces,
// and every other control or format character (escape sequences, bidi
// overrides, zero-width characters) is dropped.
func Printable(s string) string {
	s = strings.ToValidUTF8(s, "?")
	return strings.Map(func(r rune) rune {
		switch {
		case r == '\n' || r == '\r' || r == '\t':
			return ' '
		case unicode.IsControl(r) || unicode.Is(unicode.Cf, r):
			return -1
		}
		return r
	}, s)
}
