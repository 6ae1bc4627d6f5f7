package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"berth/db"
	"berth/environment"
)

// report holds the soak's verdict.
type report struct {
	runs, lost, duplicates, staleLeases, orphans, serverErrors, pgNotBack int
	outcomes                                                              map[string]int // status/error_code → runs
	lostWhy                                                               []string
}

func (r report) failed() bool {
	return r.lost > 0 || r.duplicates > 0 || r.staleLeases > 0 || r.orphans > 0 || r.serverErrors > 0 || r.pgNotBack > 0
}

// check counts, in the database and /proc, what must never happen.
func (s *soak) check(ctx context.Context) report {
	r := report{runs: len(s.runs), outcomes: map[string]int{}, pgNotBack: s.pgNotBack}
	for _, id := range s.order {
		rec := s.runs[id]
		run, err := db.RunByID(ctx, s.pool, s.company, id)
		if err != nil {
			r.lost++
			r.lostWhy = append(r.lostWhy, fmt.Sprintf("%s: %v", id, err))
			continue
		}
		r.outcomes[run.Status+"/"+run.ErrorCode]++
		if why := s.judge(ctx, rec, run); why != "" {
			r.lost++
			r.lostWhy = append(r.lostWhy, fmt.Sprintf("%s (%s task): %s", id, rec.task.kind.name, why))
		}
		if !run.Live() {
			if pids, _ := environment.FindTagged(id); len(pids) > 0 {
				r.orphans += len(pids)
				fmt.Printf("soak: run %s ended %s but processes %v still carry its tag\n", id, run.Status, pids)
			}
		}
	}
	count := func(sql string) int {
		var n int
		if err := s.pool.QueryRow(ctx, sql).Scan(&n); err != nil {
			fmt.Println("soak: check query:", err)
			return 1
		}
		return n
	}
	// More than one open execution workspace for one task (an execution workspace serves one
	// task, shared or isolated).
	r.duplicates = count(`SELECT count(*) FROM (
		SELECT 1 FROM execution_workspaces WHERE status NOT IN ('closed', 'failed', 'cleanup_failed')
		AND source_task_id IS NOT NULL GROUP BY source_task_id HAVING count(*) > 1) d`)
	if r.duplicates > 0 {
		rows, err := s.pool.Query(ctx, `SELECT source_task_id::text, mode, status, count(*) FROM execution_workspaces
			WHERE status NOT IN ('closed', 'failed', 'cleanup_failed') AND source_task_id IS NOT NULL
			GROUP BY 1, 2, 3 ORDER BY 1`)
		if err == nil {
			for rows.Next() {
				var task, mode, status string
				var n int
				if rows.Scan(&task, &mode, &status, &n) == nil {
					fmt.Printf("soak: open workspaces of task %s: %d %s %s\n", task, n, mode, status)
				}
			}
			rows.Close()
		}
	}
	r.staleLeases = count(`SELECT count(*) FROM environment_leases l
		WHERE l.status IN ('acquiring', 'active', 'releasing')
		AND NOT EXISTS (SELECT 1 FROM runs WHERE runs.lease_id = l.id AND runs.status IN ('queued', 'preparing', 'running'))`)
	for code, n := range s.statuses {
		if code >= 500 && code != 503 {
			r.serverErrors += n
		}
	}
	return r
}

// judge says why a run's outcome is not what its command must have produced ("" if it is).
// Accepted besides the command's own outcome: cancelled after a cancel request, and
// failed/orphaned when the worker executing it was SIGKILLed while it was live.
func (s *soak) judge(ctx context.Context, rec *runRecord, run db.Run) string {
	k := rec.task.kind
	if run.Live() {
		return "still " + run.Status + " after settling"
	}
	if rec.cancelRequested && run.Status == db.RunCancelled {
		return ""
	}
	if run.Status == db.RunFailed && run.ErrorCode == "orphaned" && s.workerDiedDuring(run) {
		return ""
	}
	exit := "none"
	if run.ExitCode != nil {
		exit = strconv.Itoa(*run.ExitCode)
	}
	if run.Status != k.status || run.ErrorCode != k.errCode || exit != strconv.Itoa(k.exit) {
		return fmt.Sprintf("ended %s/%s exit %s (%s), want %s/%s exit %d", run.Status, run.ErrorCode, exit,
			run.ErrorMessage, k.status, k.errCode, k.exit)
	}
	l, err := db.RunLogOf(ctx, s.pool, s.company, run.ID)
	if err != nil {
		return "log: " + err.Error()
	}
	lines := strings.Split(strings.TrimSpace(string(l.Data)), "\n")
	if last := lines[len(lines)-1]; last != k.lastLine {
		return fmt.Sprintf("log ends %q, want %q", last, k.lastLine)
	}
	return ""
}

// workerDiedDuring reports whether a worker SIGKILL fell between the run's creation and its end
// while the worker node held it (or before any node took it).
func (s *soak) workerDiedDuring(run db.Run) bool {
	if run.NodeID != "" && run.NodeID != "soak-worker" {
		return false
	}
	end := time.Now()
	if run.FinishedAt != nil {
		end = *run.FinishedAt
	}
	for _, k := range s.workerKills {
		if k.After(run.CreatedAt.Add(-time.Second)) && k.Before(end.Add(time.Second)) {
			return true
		}
	}
	return false
}

// leftoverProcesses counts the processes that still belong to the instance after serve and
// worker stopped: anything whose command line or environment names the soak's data dir, or
// that carries a run tag (BERTH_RUN_ID).
func (s *soak) leftoverProcesses() int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	dir := []byte(s.dataDir())
	n := 0
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		environ, _ := os.ReadFile("/proc/" + e.Name() + "/environ")
		if bytes.Contains(cmdline, dir) || bytes.Contains(environ, dir) || bytes.Contains(environ, []byte("\x00BERTH_RUN_ID=")) &&
			s.ourRunTag(environ) {
			n++
			fmt.Printf("soak: process %d still runs after shutdown: %s\n", pid, bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}))
		}
	}
	return n
}

// ourRunTag reports whether an environment's BERTH_RUN_ID names one of the soak's runs.
func (s *soak) ourRunTag(environ []byte) bool {
	for _, kv := range bytes.Split(environ, []byte{0}) {
		if id, ok := bytes.CutPrefix(kv, []byte("BERTH_RUN_ID=")); ok {
			_, ours := s.runs[string(id)]
			return ours
		}
	}
	return false
}

func (s *soak) print(r report) {
	fmt.Println()
	fmt.Printf("soak: %d runs (%d refused 409 run_in_progress), %d cancels, %d workspace closes, %d worker SIGKILLs, %d postmaster SIGKILLs (longest outage %s, %d not back within 60 s)\n",
		r.runs, s.conflicts, s.cancels, s.closes, len(s.workerKills), len(s.pgKills), s.pgDown.Round(100*time.Millisecond), s.pgNotBack)
	var outcomes []string
	for k, n := range r.outcomes {
		outcomes = append(outcomes, fmt.Sprintf("%s=%d", strings.TrimSuffix(k, "/"), n))
	}
	sort.Strings(outcomes)
	var codes []string
	for c, n := range s.statuses {
		codes = append(codes, fmt.Sprintf("%d=%d", c, n))
	}
	sort.Strings(codes)
	fmt.Printf("soak: outcomes %s; API answers %s\n", strings.Join(outcomes, " "), strings.Join(codes, " "))
	for _, why := range r.lostWhy {
		fmt.Println("soak: lost run", why)
	}
	fmt.Printf("lost runs: %d\n", r.lost)
	fmt.Printf("duplicate workspaces: %d\n", r.duplicates)
	fmt.Printf("active leases without a live run: %d\n", r.staleLeases)
	fmt.Printf("orphan processes: %d\n", r.orphans)
	fmt.Printf("http 500 answers: %d\n", r.serverErrors)
	if s.pgNotBack > 0 {
		fmt.Printf("postgres restarts over 60 s: %d\n", s.pgNotBack)
	}
}
