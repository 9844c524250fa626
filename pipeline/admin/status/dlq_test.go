package status

import "testing"

// A poison record's command-type header is shown only when it reads as a
// type name: a producer may have put a tenant's data or control
// characters there.
func TestCommandTypeShowsNamesOnly(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"Deposit", "Deposit"},
		{"ledger.CreditTransfer", "ledger.CreditTransfer"},
		{"", ""},
		{"acme/acc-1 4111 1111 1111 1111", "(not a type name)"},
		{"Deposit\x1b[2J", "(not a type name)"},
		{"<script>", "(not a type name)"},
	} {
		if got := commandType(tc.in); got != tc.want {
			t.Errorf("commandType(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
