package avro_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/onceflow/onceflow/pipeline/avro"
)

// rec is a record of namespace t with the given fields (JSON objects).
func rec(name string, fields ...string) string {
	return `{"type":"record","name":"` + name + `","namespace":"t","fields":[` + strings.Join(fields, ",") + `]}`
}

// topic is a topic's schema as onceflow writes them: a union of records.
func topic(records ...string) string { return "[" + strings.Join(records, ",") + "]" }

// fld is a field of type typ (JSON), with a default (JSON) unless def is "".
func fld(name, typ, def string) string {
	f := `{"name":"` + name + `","type":` + typ
	if def != "" {
		f += `,"default":` + def
	}
	return f + "}"
}

var withdrawnRec = rec("Withdrawn", fld("amount", `"long"`, ""))

// depositedTopic is the topic with a Deposited record of the given fields and a
// Withdrawn record.
func depositedTopic(fields ...string) string {
	return topic(rec("Deposited", fields...), withdrawnRec)
}

// TestCompatibilityRules registers a version and then the next under a
// compatibility level, and checks which changes the embedded registry
// refuses and that its error names what is at fault: the rules of Avro
// schema resolution as Serde.Decode applies them, for the union-of-records
// schemas onceflow's topics have.
func TestCompatibilityRules(t *testing.T) {
	t.Parallel()
	amount := fld("amount", `"long"`, "")
	for _, tc := range []struct {
		name     string
		level    sr.CompatibilityLevel // 0: the default, BACKWARD
		old, new string
		want     string // "" accepted, else a part of the error
	}{
		{"field added with a default", 0, depositedTopic(amount), depositedTopic(amount, fld("memo", `"string"`, `""`)), ""},
		{"field added without a default", 0, depositedTopic(amount), depositedTopic(amount, fld("memo", `"string"`, "")),
			"record t.Deposited, field memo: the new schema has no default for it and version 1 lacks the field"},
		{"optional field added, default null", 0, depositedTopic(amount), depositedTopic(amount, fld("memo", `["null","string"]`, "null")), ""},
		{"field removed", 0, depositedTopic(amount, fld("memo", `"string"`, "")), depositedTopic(amount), ""},
		{"field removed, FORWARD", sr.CompatForward, depositedTopic(amount, fld("memo", `"string"`, "")), depositedTopic(amount),
			"record t.Deposited, field memo: version 1 has no default for it and the new schema lacks the field"},
		{"field removed, FULL", sr.CompatFull, depositedTopic(amount, fld("memo", `"string"`, "")), depositedTopic(amount), "field memo"},
		{"field added with a default, FULL", sr.CompatFull, depositedTopic(amount), depositedTopic(amount, fld("memo", `"string"`, `""`)), ""},
		{"field renamed with an alias", 0, depositedTopic(amount), depositedTopic(`{"name":"sum","type":"long","aliases":["amount"]}`), ""},
		{"field renamed without an alias", 0, depositedTopic(amount), depositedTopic(fld("sum", `"long"`, "")), "field sum"},
		{"type changed", 0, depositedTopic(amount), depositedTopic(fld("amount", `"string"`, "")),
			"record t.Deposited, field amount: version 1 writes long, which the new schema's string cannot read"},
		{"int to long", 0, depositedTopic(fld("amount", `"int"`, "")), depositedTopic(amount), ""},
		{"int to float", 0, depositedTopic(fld("amount", `"int"`, "")), depositedTopic(fld("amount", `"float"`, "")), ""},
		{"int to double", 0, depositedTopic(fld("amount", `"int"`, "")), depositedTopic(fld("amount", `"double"`, "")), ""},
		{"long to double", 0, depositedTopic(amount), depositedTopic(fld("amount", `"double"`, "")), ""},
		{"float to double", 0, depositedTopic(fld("amount", `"float"`, "")), depositedTopic(fld("amount", `"double"`, "")), ""},
		{"string to bytes", 0, depositedTopic(fld("memo", `"string"`, "")), depositedTopic(fld("memo", `"bytes"`, "")), ""},
		{"bytes to string", 0, depositedTopic(fld("memo", `"bytes"`, "")), depositedTopic(fld("memo", `"string"`, "")), ""},
		{"long to int", 0, depositedTopic(amount), depositedTopic(fld("amount", `"int"`, "")), "version 1 writes long, which the new schema's int cannot read"},
		{"double to float", 0, depositedTopic(fld("amount", `"double"`, "")), depositedTopic(fld("amount", `"float"`, "")), "field amount"},
		{"int to long, FORWARD", sr.CompatForward, depositedTopic(fld("amount", `"int"`, "")), depositedTopic(amount), "the new schema writes long, which version 1's int cannot read"},
		{"logical type added", 0, depositedTopic(amount), depositedTopic(fld("amount", `{"type":"long","logicalType":"timestamp-millis"}`, "")), ""},
		{"required to optional", 0, depositedTopic(amount), depositedTopic(fld("amount", `["null","long"]`, "")), ""},
		{"optional to required", 0, depositedTopic(fld("amount", `["null","long"]`, "")), depositedTopic(amount),
			"field amount: version 1 writes null, which the new schema's long cannot read"},
		{"union branch removed", 0, depositedTopic(amount), topic(rec("Deposited", amount)),
			"version 1 has record t.Withdrawn in its top-level union and the new schema does not"},
		{"union branch added", 0, topic(rec("Deposited", amount)), depositedTopic(amount), ""},
		{"union branch added, FORWARD", sr.CompatForward, topic(rec("Deposited", amount)), depositedTopic(amount),
			"the new schema has record t.Withdrawn in its top-level union and version 1 does not"},
		{"union branches reordered", 0, depositedTopic(amount), topic(withdrawnRec, rec("Deposited", amount)), ""},
		{"record moved to another namespace", 0, depositedTopic(amount),
			topic(strings.Replace(rec("Deposited", amount), `"namespace":"t"`, `"namespace":"u"`, 1), withdrawnRec),
			"version 1 has record t.Deposited in its top-level union"},
		{"nested record gains a field with a default", 0,
			depositedTopic(fld("to", rec("Party", fld("id", `"string"`, "")), "")),
			depositedTopic(fld("to", rec("Party", fld("id", `"string"`, ""), fld("bank", `"string"`, `""`)), "")), ""},
		{"nested record gains a field without a default", 0,
			depositedTopic(fld("to", rec("Party", fld("id", `"string"`, "")), "")),
			depositedTopic(fld("to", rec("Party", fld("id", `"string"`, ""), fld("bank", `"string"`, "")), "")),
			"record t.Deposited, field to, record t.Party, field bank: the new schema has no default"},
		{"array items promoted", 0, depositedTopic(fld("xs", `{"type":"array","items":"int"}`, "")), depositedTopic(fld("xs", `{"type":"array","items":"long"}`, "")), ""},
		{"map values changed", 0, depositedTopic(fld("m", `{"type":"map","values":"long"}`, "")), depositedTopic(fld("m", `{"type":"map","values":"boolean"}`, "")),
			"field m, map values: version 1 writes long"},
		{"enum symbol added", 0, depositedTopic(fld("c", `{"type":"enum","name":"C","symbols":["A"]}`, "")), depositedTopic(fld("c", `{"type":"enum","name":"C","symbols":["A","B"]}`, "")), ""},
		{"enum symbol removed", 0, depositedTopic(fld("c", `{"type":"enum","name":"C","symbols":["A","B"]}`, "")), depositedTopic(fld("c", `{"type":"enum","name":"C","symbols":["A"]}`, "")),
			"enum t.C: version 1 has symbols B that the new schema lacks"},
		{"enum symbol removed, with a default", 0, depositedTopic(fld("c", `{"type":"enum","name":"C","symbols":["A","B"]}`, "")), depositedTopic(fld("c", `{"type":"enum","name":"C","symbols":["A"],"default":"A"}`, "")), ""},
		{"fixed resized", 0, depositedTopic(fld("f", `{"type":"fixed","name":"F","size":16}`, "")), depositedTopic(fld("f", `{"type":"fixed","name":"F","size":8}`, "")),
			"version 1 has fixed t.F of size 16, the new schema has fixed t.F of size 8"},
		{"anything, NONE", sr.CompatNone, depositedTopic(amount), topic(rec("Other", fld("x", `"boolean"`, ""))), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			reg := avro.NewEmbedded()
			if tc.level != 0 {
				if err := reg.SetCompatibility("s-value", tc.level); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := reg.Register(ctx, "s-value", tc.old); err != nil {
				t.Fatalf("version 1: %v", err)
			}
			_, err := reg.Register(ctx, "s-value", tc.new)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("got %v, want the version accepted", err)
			case tc.want != "" && !errors.Is(err, avro.ErrIncompatibleSchema):
				t.Errorf("got %v, want ErrIncompatibleSchema", err)
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Errorf("got %v, want it to say %q", err, tc.want)
			}
		})
	}
}

// TestCompatibilityTransitive: BACKWARD checks the new version against the
// latest only, BACKWARD_TRANSITIVE against every earlier one.
func TestCompatibilityTransitive(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	amount := fld("amount", `"long"`, "")
	versions := []string{
		depositedTopic(amount),
		depositedTopic(amount, fld("memo", `"string"`, `""`)),
		depositedTopic(amount, fld("memo", `"string"`, "")), // reads version 2, not version 1
	}
	for _, tc := range []struct {
		level sr.CompatibilityLevel
		want  string
	}{
		{sr.CompatBackward, ""},
		{sr.CompatBackwardTransitive, "field memo: the new schema has no default for it and version 1 lacks the field"},
	} {
		reg := avro.NewEmbedded()
		if err := reg.SetCompatibility("", tc.level); err != nil { // the default of every subject
			t.Fatal(err)
		}
		var err error
		for _, v := range versions {
			if _, err = reg.Register(ctx, "s-value", v); err != nil {
				break
			}
		}
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%v: got %v, want %q", tc.level, err, tc.want)
		}
	}
}

// TestCompatibilityWorkIsBounded: a schema that reuses a named type at
// every level (2^40 paths through 40 records) is checked in one pass per
// pair of types, not per path.
func TestCompatibilityWorkIsBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	build := func(extra string) string {
		s := rec("R0", fld("x", `"long"`, "")+extra)
		for i := 1; i <= 40; i++ {
			s = rec(fmt.Sprintf("R%d", i), fld("a", s, ""), fld("b", fmt.Sprintf(`"t.R%d"`, i-1), ""))
		}
		return s
	}
	reg := avro.NewEmbedded()
	if _, err := reg.Register(ctx, "s-value", build("")); err != nil {
		t.Fatal(err)
	}
	_, err := reg.Register(ctx, "s-value", build(","+fld("y", `"long"`, "")))
	if !errors.Is(err, avro.ErrIncompatibleSchema) || !strings.Contains(err.Error(), "field y") {
		t.Errorf("got %v, want the field without a default named", err)
	}
}
