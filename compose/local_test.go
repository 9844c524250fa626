package compose

import (
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/onceflow/onceflow/test/kafkacluster"
)

// stackFile is what TestLocalOverride reads of a compose file.
type stackFile struct {
	Services map[string]struct {
		Image       string            `yaml:"image"`
		Profiles    []string          `yaml:"profiles"`
		Ports       []string          `yaml:"ports"`
		Volumes     []string          `yaml:"volumes"`
		Environment map[string]string `yaml:"environment"`
	} `yaml:"services"`
	Volumes map[string]any `yaml:"volumes"`
}

func readStack(t *testing.T, name string) stackFile {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	var f stackFile
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return f
}

// officialOnly are the services whose images cannot be built from
// Debian's packages: the local override puts them in the profile
// official-images, and the local stack runs without them
// (docker-compose.local.yml says why).
var officialOnly = []string{"grafana", "schema-registry"}

// The local override (docs/deploy.md#the-local-stack) runs the stack the
// users run: the same services, each with an image scripts/images.sh
// builds (or left out, for the two that cannot be built here), the same
// ports and volumes, which it leaves to docker-compose.yml (an override
// adds to a list, so a port or volume in it would be one more); no
// component left pointing at the schema registry it does not start; the
// Kafka stand-in at the version make kafka-up runs. And nothing of the
// stack is published beyond the host's loopback.
func TestLocalOverride(t *testing.T) {
	base, local := readStack(t, "docker-compose.yml"), readStack(t, "docker-compose.local.yml")
	if got, want := slices.Sorted(maps.Keys(local.Services)), slices.Sorted(maps.Keys(base.Services)); !slices.Equal(got, want) {
		t.Fatalf("docker-compose.local.yml names services %v; docker-compose.yml %v", got, want)
	}
	if len(local.Volumes) > 0 {
		t.Errorf("docker-compose.local.yml declares volumes %v: the stack's are docker-compose.yml's", slices.Sorted(maps.Keys(local.Volumes)))
	}
	images, err := os.ReadFile("../scripts/images.sh")
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for name, s := range local.Services {
		b := base.Services[name]
		if len(s.Ports) > 0 || len(s.Volumes) > 0 {
			t.Errorf("%s: the override sets ports %v and volumes %v; leave them to docker-compose.yml", name, s.Ports, s.Volumes)
		}
		if slices.Equal(s.Profiles, []string{"official-images"}) && s.Image == "" {
			left = append(left, name)
			continue
		}
		repo, tag, _ := strings.Cut(strings.TrimPrefix(s.Image, "localhost/"), ":")
		if !strings.HasPrefix(s.Image, "localhost/") || !strings.Contains(string(images), "localhost/"+repo+":") {
			t.Errorf("%s: image %q is not one scripts/images.sh builds", name, s.Image)
		}
		if repo == "onceflow-kafka" && tag != kafkacluster.Version {
			t.Errorf("%s: Kafka %s; make kafka-up runs %s (test/kafkacluster/pom.xml)", name, tag, kafkacluster.Version)
		}
		if _, ok := b.Environment["SCHEMA_REGISTRY_URL"]; ok {
			if url, ok := s.Environment["SCHEMA_REGISTRY_URL"]; !ok || url != "" {
				t.Errorf("%s: the local stack has no schema registry: want SCHEMA_REGISTRY_URL empty (the embedded registry)", name)
			}
		}
	}
	if slices.Sort(left); !slices.Equal(left, officialOnly) {
		t.Errorf("services left out of the local stack: %v, want %v", left, officialOnly)
	}
	for name, s := range base.Services {
		for _, p := range s.Ports {
			if !strings.HasPrefix(p, "127.0.0.1:") {
				t.Errorf("%s publishes %q beyond the host's loopback: want 127.0.0.1:HOST:CONTAINER", name, p)
			}
		}
	}
}

// The images the components run from: the Dockerfile's for users (its last
// stage distroless, without a shell, as nonroot) and the local stack's
// (compose/local/onceflow.Containerfile, as the same user id), both
// labelled with the version they were built from.
func TestImagesRunAsNonRootWithTheirVersion(t *testing.T) {
	for _, f := range []struct{ file, from, user string }{
		{"../Dockerfile", "gcr.io/distroless/static-debian12:nonroot", "nonroot"},
		{"local/onceflow.Containerfile", "localhost/onceflow-debian:bookworm", "65532:65532"},
	} {
		b, err := os.ReadFile(f.file)
		if err != nil {
			t.Fatal(err)
		}
		// The last stage's instructions.
		stage := string(b)[strings.LastIndex(string(b), "\nFROM ")+1:]
		for _, want := range []string{"FROM " + f.from + "\n", "\nUSER " + f.user + "\n", "\nARG VERSION", `org.opencontainers.image.version="${VERSION}"`} {
			if !strings.Contains(stage, want) {
				t.Errorf("%s: its last stage lacks %q", f.file, strings.TrimSpace(want))
			}
		}
		if strings.Contains(stage, "RUN ") {
			t.Errorf("%s: its last stage runs a command, so needs a shell", f.file)
		}
	}
}
