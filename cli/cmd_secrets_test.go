package cli_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// secretEnv sets every variable that holds a secret to a value the tests
// look for in what onceflow prints.
var secretEnv = map[string]string{
	"DATABASE_URL":             "postgres://onceflow:SECRET-DB@db.example:5432/onceflow",
	"KAFKA_SASL_MECHANISM":     "PLAIN",
	"KAFKA_SASL_USER":          "onceflow",
	"KAFKA_SASL_PASSWORD":      "SECRET-SASL",
	"SCHEMA_REGISTRY_URL":      "https://onceflow:SECRET-REGURL@registry.example",
	"SCHEMA_REGISTRY_PASSWORD": "SECRET-REGPW",
	"ONCEFLOW_ADMIN_TOKEN":     "SECRET-ADMIN",
	"ONCEFLOW_DEV_API_KEY":     "of_SECRET-KEY",
}

// No command's -h or flag error prints a secret from the environment, and
// a mistyped command does not echo the rest of its line (which may be a
// key pasted in the wrong place).
func TestCommandsHideSecrets(t *testing.T) {
	getenv := func(k string) string { return secretEnv[k] }
	for _, name := range commandNames(t) {
		for _, flag := range []string{"-h", "-no-such-flag"} {
			var out bytes.Buffer
			args := append(strings.Fields(name), flag)
			err := run(context.Background(), args, getenv, &out)
			text := out.String()
			if err != nil {
				text += err.Error()
			}
			if strings.Contains(text, "SECRET") {
				t.Errorf("onceflow %s %s prints a secret:\n%s", name, flag, text)
			}
		}
	}
	for _, args := range [][]string{{"tenants", "revoke", "of_SECRET-KEY"}, {"of_SECRET-KEY"}, {"tenants", "keys", "of_SECRET-KEY"}} {
		var out bytes.Buffer
		err := run(context.Background(), args, getenv, &out)
		if err == nil || strings.Contains(err.Error()+out.String(), "SECRET") {
			t.Errorf("onceflow %v: %v, want an error that does not echo the key", args, err)
		}
	}
}
