package main

import (
	"context"
	"os"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// clockTicks is Linux's USER_HZ, the unit of /proc's CPU times.
const clockTicks = 100

// cpuUse is the CPU a step used, in cores (CPU seconds per second): the
// load generator (this process), the system's own processes, the Postgres
// backends serving its database, and the whole machine (which includes
// everything else that ran).
type cpuUse struct{ Load, System, Postgres, Machine float64 }

// cpuSnap is CPU seconds consumed so far.
type cpuSnap struct {
	load, system float64
	postgres     map[int]float64 // backend pid -> CPU seconds
	machine      float64
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
// target's database (nil if it cannot tell).
func backends(ctx context.Context, adminURL, db string) []int {
	if adminURL == "" || db == "" {
		return nil
	}
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return nil
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = $1`, db)
	if err != nil {
		return nil
	}
	pids, _ := pgx.CollectRows(rows, pgx.RowTo[int32])
	out := make([]int, len(pids))
	for i, p := range pids {
		out[i] = int(p)
	}
	return out
}

func (t *target) cpu(ctx context.Context) cpuSnap {
	s := cpuSnap{load: procCPU(os.Getpid()), machine: machineCPU(), postgres: map[int]float64{}}
	for _, pid := range t.pids {
		s.system += procCPU(pid)
	}
	for _, pid := range backends(ctx, t.adminURL, t.db) {
		s.postgres[pid] = procCPU(pid)
	}
	return s
}

// cpuBetween is the cores each part used between two snapshots secs apart.
// Backends present at both count (a pool's connections stay open).
func cpuBetween(a, b cpuSnap, secs float64) cpuUse {
	if secs <= 0 {
		return cpuUse{}
	}
	var pg float64
	for pid, v := range b.postgres {
		if w, ok := a.postgres[pid]; ok {
			pg += v - w
		}
	}
	return cpuUse{Load: (b.load - a.load) / secs, System: (b.system - a.system) / secs, Postgres: pg / secs, Machine: (b.machine - a.machine) / secs}
}
