package ingest

import (
	"errors"
	"math"
	"strconv"
	"strings"
)

var (
	errNotInteger = errors.New("must be a whole number")
	errTooLarge   = errors.New("must fit in 64 bits (at most 9223372036854775807)")
	errNotNumber  = errors.New("must be a number")
)

// exactInt64 reads a JSON number literal as an int64 exactly, whatever its
// spelling: 100, 1e2, 100.0 and 1.00e2 are all 100; 100.5 and 1e-1 are not
// integers; 1e19 and 9223372036854775808 do not fit. It works on the
// decimal digits rather than through float64, which would silently round
// 12345678901234567.0 to a different amount, and it never materializes
// 10^exponent, so a hostile 1e999999999 costs nothing.
func exactInt64(s string) (int64, error) {
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	mant, expPart, hasExp := strings.Cut(strings.ToLower(s), "e")
	intPart, frac, _ := strings.Cut(mant, ".")
	if !allDigits(intPart) || intPart == "" || !allDigits(frac) {
		return 0, errNotNumber
	}
	digits := strings.TrimLeft(intPart+frac, "0")
	if digits == "" {
		if hasExp && !validExp(expPart) {
			return 0, errNotNumber
		}
		return 0, nil // zero in any spelling
	}
	// value = digits × 10^exp
	exp := -len(frac)
	if hasExp {
		if !validExp(expPart) {
			return 0, errNotNumber
		}
		e, err := strconv.Atoi(expPart)
		if err != nil { // out of int's range: astronomically large or small
			if strings.HasPrefix(expPart, "-") {
				return 0, errNotInteger
			}
			return 0, errTooLarge
		}
		if e > math.MaxInt32 || e < math.MinInt32 {
			if e < 0 {
				return 0, errNotInteger
			}
			return 0, errTooLarge
		}
		exp += e
	}
	for strings.HasSuffix(digits, "0") {
		digits = digits[:len(digits)-1]
		exp++
	}
	if exp < 0 {
		return 0, errNotInteger // a nonzero digit remains after the point
	}
	if len(digits)+exp > 19 {
		return 0, errTooLarge
	}
	u, err := strconv.ParseUint(digits+strings.Repeat("0", exp), 10, 64)
	if err != nil {
		return 0, errTooLarge
	}
	switch {
	case !neg && u <= math.MaxInt64:
		return int64(u), nil
	case neg && u <= math.MaxInt64+1:
		return -int64(u-1) - 1, nil
	}
	return 0, errTooLarge
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func validExp(s string) bool {
	s = strings.TrimPrefix(strings.TrimPrefix(s, "+"), "-")
	return s != "" && allDigits(s)
}
