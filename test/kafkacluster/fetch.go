package kafkacluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed" // the build file, embedded
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"syscall"
)

// pom is the project's build file for Apache Kafka's jars: the broker, its
// tools and a logging binding, at a pinned version.
//
//go:embed pom.xml
var pom []byte

// Version is the Apache Kafka version the local clusters run (pom.xml's
// kafka.version).
var Version = func() string {
	m := regexp.MustCompile(`<kafka\.version>([^<]+)</kafka\.version>`).FindSubmatch(pom)
	if m == nil {
		panic("kafkacluster: pom.xml names no kafka.version")
	}
	return string(m[1])
}()

// DefaultCacheDir is where Fetch keeps the jars when not told otherwise:
// .data/apache-kafka at the repository's root (ignored by git), next to
// the private Postgres cluster.
func DefaultCacheDir() string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return filepath.Join(".data", "apache-kafka")
	}
	return filepath.Join(filepath.Dir(file), "..", "..", ".data", "apache-kafka")
}

// Fetch returns a directory holding Apache Kafka's jars and their
// dependencies, resolved from pom.xml with Maven (`mvn -B -q
// dependency:copy-dependencies`) into cacheDir the first time and reused
// after: the directory is named after the version and the build file's
// hash, so a changed pom.xml fetches again. Concurrent callers (two test
// processes) wait for one another. It needs `mvn` on PATH only when the
// jars are not cached yet.
func Fetch(ctx context.Context, cacheDir string) (string, error) {
	if cacheDir == "" {
		cacheDir = DefaultCacheDir()
	}
	sum := sha256.Sum256(pom)
	dir, err := filepath.Abs(filepath.Join(cacheDir, Version+"-"+hex.EncodeToString(sum[:4])))
	if err != nil {
		return "", err
	}
	lib := filepath.Join(dir, "lib")
	done := filepath.Join(dir, "complete")
	if _, err := os.Stat(done); err == nil {
		return lib, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("lock %s: %w", dir, err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if _, err := os.Stat(done); err == nil {
		return lib, nil // another process fetched them while we waited
	}
	if _, err := exec.LookPath("mvn"); err != nil {
		return "", fmt.Errorf("no mvn on PATH: Apache Kafka's jars are not in %s yet, and fetching them needs Maven and Java 17: %w", dir, err)
	}
	pomPath := filepath.Join(dir, "pom.xml")
	if err := os.WriteFile(pomPath, pom, 0o644); err != nil {
		return "", err
	}
	os.RemoveAll(lib)
	cmd := exec.CommandContext(ctx, "mvn", "-B", "-q", "-f", pomPath,
		"dependency:copy-dependencies", "-DoutputDirectory="+lib)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("mvn dependency:copy-dependencies (Apache Kafka %s): %w\n%s", Version, err, out.Bytes())
	}
	if err := os.WriteFile(done, nil, 0o644); err != nil {
		return "", err
	}
	return lib, nil
}
