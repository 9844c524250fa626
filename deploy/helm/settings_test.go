package helm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// The binary whose -h lists the settings: ONCEFLOW_BIN (make test passes
// bin/onceflow), else built once from this tree.
var (
	binOnce sync.Once
	binPath string
	binErr  error
)

func onceflowBin(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		if p := os.Getenv("ONCEFLOW_BIN"); p != "" {
			binPath = p
			return
		}
		dir, err := os.MkdirTemp("", "onceflow-helm-test")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "onceflow")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "build", "-o", binPath, "./cmd/onceflow")
		cmd.Dir = filepath.Join("..", "..")
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build ./cmd/onceflow: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// known is what one command reads: its variables, and the secret ones'
// NAME_FILE forms.
type known struct {
	vars    map[string]bool // every variable, NAME_FILE forms included
	secrets map[string]bool // the secret settings' names (without _FILE)
}

// A setting's line in -h ends with its variable: "(NAME)" or, for a
// secret, "(NAME or NAME_FILE)", then " (set)" and " (default ...)" if
// they apply; a variable without a flag is "  NAME (environment only)".
var (
	helpVar     = regexp.MustCompile(`(?m)\(([A-Z][A-Z0-9_]*)(?: or ([A-Z][A-Z0-9_]*)_FILE)?\)(?: \(set\))?(?: \(default .*\))?$`)
	helpEnvOnly = regexp.MustCompile(`(?m)^  ([A-Z][A-Z0-9_]*) \(environment only\)$`)
)

var (
	settingsMu sync.Mutex
	settingsOf = map[string]known{}
)

// settings runs `onceflow ARGS -h` in an empty environment and reads the
// variables it lists.
func settings(t *testing.T, args ...string) known {
	t.Helper()
	key := strings.Join(args, " ")
	settingsMu.Lock()
	defer settingsMu.Unlock()
	if k, ok := settingsOf[key]; ok {
		return k
	}
	cmd := exec.Command(onceflowBin(t), append(args, "-h")...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("onceflow %s -h: %v\n%s", key, err, out)
	}
	k := known{vars: map[string]bool{}, secrets: map[string]bool{}}
	for _, m := range helpVar.FindAllStringSubmatch(string(out), -1) {
		k.vars[m[1]] = true
		if m[2] != "" {
			if m[2] != m[1] {
				t.Fatalf("onceflow %s -h: %q names %s_FILE for %s", key, m[0], m[2], m[1])
			}
			k.secrets[m[1]] = true
			k.vars[m[1]+"_FILE"] = true
		}
	}
	for _, m := range helpEnvOnly.FindAllStringSubmatch(string(out), -1) {
		k.vars[m[1]] = true
	}
	if len(k.vars) < 2 {
		t.Fatalf("onceflow %s -h lists %d variables; the format changed?\n%s", key, len(k.vars), out)
	}
	settingsOf[key] = k
	return k
}

// commandOf is the onceflow command a container runs: the image's
// component binaries (ingest, relay, ...) are `onceflow ingest`, ...
func commandOf(c corev1.Container) []string {
	if len(c.Command) == 0 {
		return nil
	}
	if c.Command[0] != "onceflow" {
		return c.Command[:1]
	}
	var out []string
	for _, a := range c.Command[1:] {
		if strings.HasPrefix(a, "-") {
			break
		}
		out = append(out, a)
	}
	return out
}

// TestEveryVariableIsASetting: every variable a container of the chart
// sets is a setting that container's command reads, as its -h lists it
// (the setting's declaration in cli/internal/command/settings.go): a misspelt name, a
// setting of another component (KAFKA_BROKERS on the worker) or one
// that no longer exists fails here instead of being silently ignored.
// A secret's NAME_FILE counts only where NAME is a secret setting.
func TestEveryVariableIsASetting(t *testing.T) {
	for name, files := range valueSets {
		t.Run(name, func(t *testing.T) {
			m := render(t, values(t, files))
			for _, p := range m.pods() {
				for _, c := range p.containers() {
					cmd := commandOf(c)
					if cmd == nil {
						t.Errorf("%s container %s: no command", p.workload, c.Name)
						continue
					}
					k := settings(t, cmd...)
					for _, e := range c.Env {
						if !k.vars[e.Name] {
							t.Errorf("%s container %s (onceflow %s) sets %s, which it does not read", p.workload, c.Name, strings.Join(cmd, " "), e.Name)
						}
					}
					if len(c.EnvFrom) > 0 {
						t.Errorf("%s container %s takes variables from elsewhere (envFrom), which this test cannot check", p.workload, c.Name)
					}
				}
			}
		})
	}
}

// TestSecretsAreMountedFiles: no secret lands in a ConfigMap, a plain
// variable or an argument. Every secret setting a container reads (by its
// -h) is absent or given as NAME_FILE, whose path is a file of a volume
// made of Secrets only, mounted read-only; the chart makes no Secret (the
// operator's Secrets are referred to by name) and no ConfigMap names a
// secret setting; and the secured values' components mount only their own
// Kafka password.
func TestSecretsAreMountedFiles(t *testing.T) {
	for name, files := range valueSets {
		t.Run(name, func(t *testing.T) {
			m := render(t, values(t, files))
			for _, o := range m {
				switch x := o.obj.(type) {
				case *corev1.Secret:
					t.Errorf("the chart renders Secret %s: secrets are the operator's, referred to by name", x.Name)
				case *corev1.ConfigMap:
					for k, v := range x.Data {
						for _, s := range secretNames(t) {
							if strings.Contains(k, s) || strings.Contains(v, s) {
								t.Errorf("ConfigMap %s's %s names the secret setting %s", x.Name, k, s)
							}
						}
					}
				}
			}
			for _, p := range m.pods() {
				files := secretFiles(p.spec)
				for _, c := range p.containers() {
					k := settings(t, commandOf(c)...)
					for _, arg := range append(append([]string(nil), c.Command...), c.Args...) {
						if strings.Contains(arg, "password") || strings.Contains(arg, "postgres://") {
							t.Errorf("%s container %s: an argument %q looks like a secret", p.workload, c.Name, arg)
						}
					}
					for _, e := range c.Env {
						base, isFile := strings.CutSuffix(e.Name, "_FILE")
						switch {
						case k.secrets[e.Name]:
							t.Errorf("%s container %s sets the secret %s as a variable; want %s_FILE", p.workload, c.Name, e.Name, e.Name)
						case isFile && k.secrets[base]:
							if e.ValueFrom != nil {
								t.Errorf("%s container %s: %s from elsewhere than a path", p.workload, c.Name, e.Name)
							}
							if src, ok := files[e.Value]; !ok || !mountedReadOnly(c, e.Value) {
								t.Errorf("%s container %s: %s=%s is not a file of a Secret mounted read-only (Secret files %v)", p.workload, c.Name, e.Name, e.Value, keys(files))
							} else if base == "KAFKA_SASL_PASSWORD" {
								user := envValue(c, "KAFKA_SASL_USER")
								if src.key != user {
									t.Errorf("%s container %s: its Kafka password is key %s of %s, want its own user's, %s", p.workload, c.Name, src.key, src.secret, user)
								}
							}
						case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
							t.Errorf("%s container %s: %s from a Secret as a variable; secrets are files", p.workload, c.Name, e.Name)
						}
					}
				}
			}
		})
	}
}

// secretNames are every secret setting any command of the chart reads.
func secretNames(t *testing.T) []string {
	var out []string
	for _, args := range [][]string{{"ingest"}, {"relay"}, {"processor"}, {"projector"}, {"worker"}, {"lag"}, {"migrate"}} {
		for s := range settings(t, args...).secrets {
			if !slices.Contains(out, s) {
				out = append(out, s)
			}
		}
	}
	slices.Sort(out)
	return out
}

// secretFile is where a mounted file comes from.
type secretFile struct {
	secret, key string
	mount       string // the volume's name
}

// secretFiles are the files of a pod's volumes that hold Secrets' keys
// and nothing else, by the path each is mounted at in a container that
// mounts its volume (a volume mixing a Secret with a ConfigMap counts as
// neither).
func secretFiles(spec corev1.PodSpec) map[string]secretFile {
	byVolume := map[string]map[string]secretFile{} // volume -> relative path -> source
	for _, v := range spec.Volumes {
		files := map[string]secretFile{}
		switch {
		case v.Secret != nil:
			for _, it := range v.Secret.Items {
				files[it.Path] = secretFile{v.Secret.SecretName, it.Key, v.Name}
			}
		case v.Projected != nil:
			for _, s := range v.Projected.Sources {
				if s.Secret == nil {
					files = nil
					break
				}
				for _, it := range s.Secret.Items {
					files[it.Path] = secretFile{s.Secret.Name, it.Key, v.Name}
				}
			}
		}
		if files != nil {
			byVolume[v.Name] = files
		}
	}
	out := map[string]secretFile{}
	for _, c := range append(append([]corev1.Container(nil), spec.InitContainers...), spec.Containers...) {
		for _, vm := range c.VolumeMounts {
			for rel, src := range byVolume[vm.Name] {
				out[filepath.Join(vm.MountPath, rel)] = src
			}
		}
	}
	return out
}

func mountedReadOnly(c corev1.Container, path string) bool {
	for _, vm := range c.VolumeMounts {
		if strings.HasPrefix(path, vm.MountPath+"/") {
			return vm.ReadOnly
		}
	}
	return false
}

func envValue(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
