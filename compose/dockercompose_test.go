package compose

import (
	"encoding/json"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
)

// docker compose itself reads the compose file as these tests do: `docker
// compose config` (which parses, merges and validates it without an
// engine) accepts it, and gives every service the environment, secrets,
// dependencies and mounts the tests read with yaml.v3 (its merge keys,
// `<<: [*a, *b]`, resolved the same way). It needs the compose plugin of
// the docker client, which CI does not install (building it from its Go
// module takes minutes): there it skips.
func TestComposeConfig(t *testing.T) {
	if err := exec.Command("docker", "compose", "version").Run(); err != nil {
		t.Skipf("docker compose is not installed (the docker client's compose plugin): %v", err)
	}
	cmd := exec.Command("docker", "compose", "-f", "docker-compose.yml", "config", "--format", "json")
	// What compose/secrets.sh writes into compose/.env, so that the test
	// runs without it (and whatever a compose/.env holds).
	vars := map[string]string{"ONCEFLOW_REGISTRY_KEYSTORE_PASSWORD": "test", "ONCEFLOW_REGISTRY_KAFKA_JAAS": "test"}
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for k, v := range vars {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("docker compose config: %v\n%s", err, stderr)
	}
	var cfg struct {
		Services map[string]struct {
			Environment map[string]*string `json:"environment"`
			Secrets     []struct {
				Source string `json:"source"`
			} `json:"secrets"`
			DependsOn map[string]struct {
				Condition string `json:"condition"`
			} `json:"depends_on"`
			Volumes []struct {
				Type   string `json:"type"`
				Source string `json:"source"`
				Target string `json:"target"`
			} `json:"volumes"`
		} `json:"services"`
	}
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatalf("docker compose config: %v", err)
	}
	s := loadStack(t)
	if got, want := slices.Sorted(maps.Keys(cfg.Services)), slices.Sorted(maps.Keys(s.Services)); !slices.Equal(got, want) {
		t.Fatalf("docker compose reads the services %v, the tests %v", got, want)
	}
	for name, c := range cfg.Services {
		mine := s.Services[name]
		env := map[string]string{}
		for k, v := range c.Environment {
			if v != nil {
				env[k] = *v
			}
		}
		for k, v := range mine.Environment {
			mine.Environment[k] = interpolate(v, vars)
		}
		if !maps.Equal(env, mine.Environment) {
			t.Errorf("%s: docker compose reads the environment\n%v\nthe tests\n%v", name, env, mine.Environment)
		}
		var secrets []string
		for _, sec := range c.Secrets {
			secrets = append(secrets, sec.Source)
		}
		if !slices.Equal(secrets, mine.Secrets) {
			t.Errorf("%s: docker compose reads the secrets %v, the tests %v", name, secrets, mine.Secrets)
		}
		for other, d := range c.DependsOn {
			if got := mine.dependsOn(other); got != d.Condition {
				t.Errorf("%s: docker compose reads its dependency on %s as %q, the tests as %q", name, other, d.Condition, got)
			}
		}
		for _, v := range c.Volumes {
			if v.Type != "bind" {
				continue
			}
			abs, err := filepath.Abs(mine.mounted(v.Target))
			if err != nil || abs != v.Source {
				t.Errorf("%s: docker compose mounts %s at %s, the tests read %s there", name, v.Source, v.Target, mine.mounted(v.Target))
			}
		}
	}
}

// reference is a variable of the compose file: ${VAR}, ${VAR:-default} or
// ${VAR:?message}.
var reference = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)(?::([-?])([^}]*))?\}`)

// interpolate replaces the variables in v with vars' values, a default or
// "", as docker compose does.
func interpolate(v string, vars map[string]string) string {
	return reference.ReplaceAllStringFunc(v, func(ref string) string {
		m := reference.FindStringSubmatch(ref)
		if val := vars[m[1]]; val != "" {
			return val
		}
		if m[2] == "-" {
			return m[3]
		}
		return ""
	})
}
