package main

import (
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/test/e2e"
)

// clockTicks is Linux's USER_HZ, the unit of /proc's CPU times.
const clockTicks = 100

// cpuUse is the CPU a step used, in cores (CPU seconds per second): the
// load generator (this process), the system's own processes (System, and
// each of them in Procs), the Postgres backends serving its database, the
// cluster's background processes (WAL writer, checkpointer, background
// writer, autovacuum: shared with every database of the server), and the
// whole machine (which includes everything else that ran).
type cpuUse struct {
	Load, System, Postgres, PostgresBackground, Machine float64
	Procs                                               []procUse
	// PostgresBy is Postgres split by the backends' application_name
	// (onceflow names a process's connections after its components:
	// "ingest", "relay", ...; "" unnamed), sorted by name.
	PostgresBy []procUse
}

// procUse is one process's cores over a step.
type procUse struct {
	Name  string
	Cores float64
}

// proc is one process of a target, named as the bill names it.
type proc struct {
	name string
	pid  int
}

// cpuSnap is CPU seconds consumed so far.
type cpuSnap struct {
	load       float64
	procs      []float64       // by the target's procs
	postgres   map[int]float64 // backend pid -> CPU seconds
	names      map[int]string  // backend pid -> application_name, less "onceflow "
	background map[int]float64 // the cluster's background processes
	machine    float64
}

// procCPU is a process's user+system CPU seconds (0 if it is gone).
func procCPU(pid int) float64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The command name may hold spaces; the fields after it are fixed.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	k, _ := strconv.ParseFloat(f[12], 64)
	return (u + k) / clockTicks
}

// machineCPU is the machine's busy CPU seconds (every CPU's time not idle
// or waiting for I/O).
func machineCPU() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	var busy float64
	for i, v := range f[1:] {
		if i == 3 || i == 4 || i >= 8 { // idle, iowait; guest times are in user already
			continue
		}
		n, _ := strconv.ParseFloat(v, 64)
		busy += n
	}
	return busy / clockTicks
}

// backends are the pids of the Postgres backends connected to the
// target's database, with their application_name, and of the cluster's
// background processes (those of no database, and autovacuum workers in
// this one); nil if it cannot tell.
func backends(ctx context.Context, adminURL, db string) (ours map[int]string, background []int) {
	if adminURL == "" || db == "" {
		return nil, nil
	}
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return nil, nil
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT pid, backend_type = 'client backend' AND datname = $1, application_name
		FROM pg_stat_activity
		WHERE pid <> pg_backend_pid() AND (datname = $1 OR backend_type <> 'client backend' AND datname IS NULL)`, db)
	if err != nil {
		return nil, nil
	}
	defer rows.Close()
	ours = map[int]string{}
	for rows.Next() {
		var pid int32
		var client bool
		var name string
		if rows.Scan(&pid, &client, &name) != nil {
			return nil, nil
		}
		if client {
			ours[int(pid)] = strings.TrimPrefix(name, "onceflow ")
		} else {
			background = append(background, int(pid))
		}
	}
	return ours, background
}

func (t *target) cpu(ctx context.Context) cpuSnap {
	s := cpuSnap{load: procCPU(os.Getpid()), machine: machineCPU(), postgres: map[int]float64{}, names: map[int]string{}, background: map[int]float64{}}
	for _, p := range t.procs {
		s.procs = append(s.procs, procCPU(p.pid))
	}
	ours, background := backends(ctx, t.adminURL, t.db)
	for pid, name := range ours {
		s.postgres[pid], s.names[pid] = procCPU(pid), name
	}
	for _, pid := range background {
		s.background[pid] = procCPU(pid)
	}
	return s
}

// cpuBetween is the cores each part used between two snapshots secs apart
// by the processes of t. A Postgres process present at both counts its
// difference (a pool's connections stay open); one that appeared between
// them (a connection opened during the step, an autovacuum worker) counts
// whole.
func (t *target) cpuBetween(a, b cpuSnap, secs float64) cpuUse {
	if secs <= 0 {
		return cpuUse{}
	}
	since := func(b, a map[int]float64) float64 {
		var sum float64
		for pid, v := range b {
			sum += v - a[pid]
		}
		return sum
	}
	u := cpuUse{Load: (b.load - a.load) / secs, Postgres: since(b.postgres, a.postgres) / secs,
		PostgresBackground: since(b.background, a.background) / secs, Machine: (b.machine - a.machine) / secs}
	by := map[string]float64{}
	for pid, v := range b.postgres {
		by[b.names[pid]] += (v - a.postgres[pid]) / secs
	}
	for _, name := range slices.Sorted(maps.Keys(by)) {
		u.PostgresBy = append(u.PostgresBy, procUse{Name: name, Cores: by[name]})
	}
	for i, p := range t.procs {
		if i < len(a.procs) && i < len(b.procs) {
			c := (b.procs[i] - a.procs[i]) / secs
			u.Procs = append(u.Procs, procUse{Name: p.name, Cores: c})
			u.System += c
		}
	}
	return u
}

// kafkaProcs are the processes of the Apache Kafka nodes KAFKA_BROKERS
// names on this machine (the JVMs listening on their ports), for the bill:
// on the embedded broker its process is one of the target's, and the
// broker's CPU belongs to a command's price on Apache Kafka as much. A
// node elsewhere, or one whose process cannot be found, is left out, and
// the report says so.
func kafkaProcs() []proc {
	if e2e.ExternalKafka() == "" {
		return nil
	}
	var out []proc
	for i, addr := range strings.Split(e2e.ExternalKafka(), ",") {
		host, port, err := net.SplitHostPort(strings.TrimSpace(addr))
		ip := net.ParseIP(host)
		if err != nil || host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			fmt.Fprintf(os.Stderr, "bench-e2e: %s is not on this machine: its CPU is not in the bill\n", addr)
			continue
		}
		n, _ := strconv.Atoi(port)
		pid := listeningPid(n)
		if pid == 0 {
			fmt.Fprintf(os.Stderr, "bench-e2e: no process found listening on %s: its CPU is not in the bill\n", addr)
			continue
		}
		out = append(out, proc{fmt.Sprintf("Apache Kafka node %d", i+1), pid})
	}
	return out
}

// listeningPid is the process with a socket listening on TCP port port
// (IPv4 or IPv6), or 0: the socket's inode from /proc/net/tcp{,6}, then
// the process holding it among /proc/*/fd.
func listeningPid(port int) int {
	var inode string
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			fields := strings.Fields(line)
			if len(fields) < 10 || fields[3] != "0A" { // 0A: LISTEN
				continue
			}
			_, hexPort, _ := strings.Cut(fields[1], ":")
			if p, err := strconv.ParseUint(hexPort, 16, 16); err == nil && int(p) == port {
				inode = fields[9]
			}
		}
	}
	if inode == "" {
		return 0
	}
	want := "socket:[" + inode + "]"
	dirs, _ := filepath.Glob("/proc/[0-9]*/fd")
	for _, dir := range dirs {
		fds, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if link, err := os.Readlink(filepath.Join(dir, fd.Name())); err == nil && link == want {
				pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
				return pid
			}
		}
	}
	return 0
}
