package environment

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"syscall"
	"time"
)

// Finding and stopping a service's processes by their ServiceVar tag. A jailed service is a
// bubblewrap process outside the jail, bubblewrap's init inside it, and the command's processes.
// SIGTERM to the outer bubblewrap would end the jail at once (its init dies with it, and the
// kernel kills the pid namespace), leaving the server no grace; so the first round signals the
// command's processes only, and the bubblewrap processes are killed after the grace.

// serviceProc is one live process tagged as a service's.
type serviceProc struct {
	pid   int
	start uint64
	pgid  int
	jail  bool // a bubblewrap process of the jail itself
}

// serviceProcs lists the live processes tagged ServiceVar=id (all services when id is ""),
// keyed by service id. Berth itself is never listed.
func serviceProcs(ctx context.Context, id string) (map[string][]serviceProc, error) {
	procs, err := scanProcsCtx(ctx, "")
	if err != nil {
		return nil, err
	}
	out := map[string][]serviceProc{}
	for _, p := range procs {
		v, ok := environValue(p.pid, ServiceVar)
		if !ok || (id != "" && v != id) {
			continue
		}
		comm, _ := os.ReadFile("/proc/" + strconv.Itoa(p.pid) + "/comm")
		out[v] = append(out[v], serviceProc{pid: p.pid, start: p.stat.start, pgid: p.stat.pgid,
			jail: string(bytes.TrimSpace(comm)) == "bwrap"})
	}
	return out, nil
}

// environValue is the value of key in a process's initial environment.
func environValue(pid int, key string) (string, bool) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return "", false
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxEnviron))
	if err != nil {
		return "", false
	}
	prefix := []byte(key + "=")
	for len(b) > 0 {
		var e []byte
		if i := bytes.IndexByte(b, 0); i >= 0 {
			e, b = b[:i], b[i+1:]
		} else {
			e, b = b, nil
		}
		if v, ok := bytes.CutPrefix(e, prefix); ok {
			return string(v), true
		}
	}
	return "", false
}

// TaggedServices lists the service ids that have live processes on this host, with their pids.
// The orphan sweep kills those no row owns.
func TaggedServices(ctx context.Context) (map[string][]int, error) {
	m, err := serviceProcs(ctx, "")
	if err != nil {
		return nil, fmt.Errorf("tagged services: %w", err)
	}
	out := make(map[string][]int, len(m))
	for id, ps := range m {
		for _, p := range ps {
			out[id] = append(out[id], p.pid)
		}
	}
	return out, nil
}

// ServiceAlive reports whether pid is still the process recorded for service id: alive, started
// at start (so not a reused pid) and tagged with the id. Only such a process may be adopted.
func ServiceAlive(id string, pid int, start uint64) bool {
	if pid <= 0 || start == 0 {
		return false
	}
	st, err := readStat(pid)
	if err != nil || !st.live() || st.start != start {
		return false
	}
	v, ok := environValue(pid, ServiceVar)
	return ok && v == id
}

// StopService stops every process of service id: SIGTERM to the command's processes, up to
// grace for them to go, then SIGKILL to whatever carries the tag (the jail's bubblewrap
// processes included, which ends its pid namespace) and to the group of leader (the process
// Berth started and has not reaped; 0 when there is none, e.g. after a restart), until none is
// left. With port > 0 it then checks that the port is free again. A pid is only ever signalled
// while a scan shows it tagged with id, so a reused pid is never hit.
func StopService(ctx context.Context, id string, leader, port int, grace time.Duration) error {
	if err := checkTag(id); err != nil {
		return fmt.Errorf("stop service: %w", err)
	}
	signalled := map[procKey]bool{}
	tctx, cancel := context.WithTimeout(ctx, grace)
	defer cancel()
	for {
		m, err := serviceProcs(tctx, id)
		if err != nil {
			break
		}
		ps := m[id]
		if len(ps) == 0 {
			return portFreed(ctx, port)
		}
		commands := 0
		for _, p := range ps {
			if p.jail {
				continue
			}
			commands++
			if k := (procKey{p.pid, p.start}); !signalled[k] {
				signalled[k] = true
				_ = syscall.Kill(p.pid, syscall.SIGTERM)
			}
		}
		if commands == 0 && leader == 0 {
			break // only the jail is left and nobody waits on it: kill it now
		}
		if tctx.Err() != nil {
			break
		}
		sleepCtx(tctx, pollEvery)
	}

	kctx, kcancel := context.WithTimeout(context.WithoutCancel(ctx), killWait)
	defer kcancel()
	if leader > 0 {
		_ = syscall.Kill(-leader, syscall.SIGKILL)
		_ = syscall.Kill(leader, syscall.SIGKILL)
	}
	for {
		m, err := serviceProcs(kctx, id)
		if err == nil && len(m[id]) == 0 {
			return portFreed(ctx, port)
		}
		if err == nil {
			for _, p := range m[id] {
				_ = syscall.Kill(p.pid, syscall.SIGKILL)
			}
		}
		if kctx.Err() != nil {
			return fmt.Errorf("stop service %s: %w", id, ErrNotGone)
		}
		sleepCtx(kctx, pollEvery)
	}
}

// portFreed waits (up to 2 s) for port to be free once a service's processes are gone.
func portFreed(ctx context.Context, port int) error {
	if port <= 0 {
		return nil
	}
	deadline := time.Now().Add(2 * time.Second)
	for !PortFree(port) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("stop service: port %d still in use: %w", port, ErrNotGone)
		}
		time.Sleep(pollEvery)
	}
	return nil
}
