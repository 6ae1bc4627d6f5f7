package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"
)

// runJSON is the part of the API's run object the soak reads.
type runJSON struct {
	ID                   string  `json:"id"`
	Status               string  `json:"status"`
	ExecutionWorkspaceID *string `json:"execution_workspace_id"`
}

// call sends one API request as the board member and decodes a JSON answer into out (if not
// nil); it returns the status, 0 when the server could not be reached at all.
func (s *soak) call(ctx context.Context, method, path string, body, out any) int {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, method, s.base+path, rd)
	req.Header.Set("Authorization", "Bearer "+s.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := s.http.Do(req)
	if err != nil {
		s.statuses[0]++
		return 0
	}
	defer resp.Body.Close()
	s.statuses[resp.StatusCode]++
	if resp.StatusCode >= 500 && resp.StatusCode != http.StatusServiceUnavailable {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		fmt.Printf("soak: %s %s = %d %s\n", method, path, resp.StatusCode, bytes.TrimSpace(b))
		return resp.StatusCode
	}
	if resp.StatusCode >= 400 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		s.lastRefusal = string(bytes.TrimSpace(b))
	}
	if out != nil && resp.StatusCode < 300 {
		_ = json.NewDecoder(resp.Body).Decode(out)
	}
	return resp.StatusCode
}

// drive issues runs, cancels and closes, and injects the faults, until the duration is over.
func (s *soak) drive(ctx context.Context) {
	began := time.Now()
	end := began.Add(s.opts.duration)
	next := func(mean time.Duration) time.Time {
		return time.Now().Add(mean/2 + time.Duration(s.rng.Int64N(int64(mean))))
	}
	nextRun, nextCancel, nextClose, nextReopen := time.Now(), next(8*time.Second), next(20*time.Second), time.Now()
	nextWorker, nextPG := next(s.opts.workerKill), next(s.opts.pgKill)
	lastReport := began
	for time.Now().Before(end) && ctx.Err() == nil {
		now := time.Now()
		switch {
		case now.After(nextWorker):
			s.killWorker()
			nextWorker = next(s.opts.workerKill)
		case now.After(nextPG):
			s.killPostmaster(ctx)
			nextPG = next(s.opts.pgKill)
		case now.After(nextCancel):
			s.cancelOne(ctx)
			nextCancel = next(8 * time.Second)
		case now.After(nextClose):
			s.closeOne(ctx)
			nextClose = next(20 * time.Second)
		case now.After(nextReopen):
			s.reopenClosed(ctx)
			nextReopen = time.Now().Add(time.Second)
		case now.After(nextRun):
			s.startOne(ctx)
			nextRun = next(time.Second)
		default:
			time.Sleep(50 * time.Millisecond)
		}
		if time.Since(lastReport) > 30*time.Second {
			lastReport = time.Now()
			fmt.Printf("soak: %s: %d runs, %d cancels, %d closes, %d worker kills, %d postmaster kills\n",
				time.Since(began).Round(time.Second), len(s.runs), s.cancels, s.closes, len(s.workerKills), len(s.pgKills))
		}
	}
}

// startOne starts a run of a random task; a task with a live run answers 409 run_in_progress.
func (s *soak) startOne(ctx context.Context) {
	t := s.tasks[s.rng.IntN(len(s.tasks))]
	if _, closing := s.reopen[t.id]; closing {
		return
	}
	var r runJSON
	created := time.Now()
	switch code := s.call(ctx, http.MethodPost, "/api/tasks/"+t.id+"/runs", nil, &r); code {
	case http.StatusAccepted:
		s.runs[r.ID] = &runRecord{id: r.ID, task: t, created: created}
		s.order = append(s.order, r.ID)
	case http.StatusConflict:
		s.conflicts++
	}
}

// cancelOne cancels a recent run of a sleeping task, whatever its state.
func (s *soak) cancelOne(ctx context.Context) {
	for i := len(s.order) - 1; i >= 0 && i >= len(s.order)-10; i-- {
		rec := s.runs[s.order[i]]
		if rec.task.kind.name != "sleep" || rec.cancelRequested {
			continue
		}
		// Recorded before the call: a cancel whose answer is lost may still have happened.
		rec.cancelRequested = true
		if s.call(ctx, http.MethodPost, "/api/runs/"+rec.id+"/cancel", nil, nil) == http.StatusAccepted {
			s.cancels++
		}
		return
	}
}

// closeOne closes the isolated workspace of a recent run whose task has no live run (a close
// with a live run is refused, which is fine too).
func (s *soak) closeOne(ctx context.Context) {
	for i := len(s.order) - 1; i >= 0 && i >= len(s.order)-20; i-- {
		rec := s.runs[s.order[i]]
		if !rec.task.isolated {
			continue
		}
		var r runJSON
		if s.call(ctx, http.MethodGet, "/api/runs/"+rec.id, nil, &r) != http.StatusOK || r.ExecutionWorkspaceID == nil ||
			r.Status == "queued" || r.Status == "preparing" || r.Status == "running" {
			continue
		}
		var ws struct {
			Status     string `json:"status"`
			Generation int64  `json:"generation"`
		}
		if s.call(ctx, http.MethodGet, "/api/execution-workspaces/"+*r.ExecutionWorkspaceID, nil, &ws) != http.StatusOK ||
			ws.Status != "ready" {
			continue
		}
		// A workspace closes once its task is done; the task is reopened when the close has
		// finished (reopenClosed), so that its next run must make a new workspace (and never a
		// second open one).
		taskPath := "/api/tasks/" + rec.task.id
		if code := s.call(ctx, http.MethodPatch, taskPath, map[string]any{"status": "done"}, nil); code >= 300 {
			s.refused("marking the task done", code)
			return
		}
		body := map[string]any{"status": "closed", "confirm_destructive": true, "generation": ws.Generation}
		if code := s.call(ctx, http.MethodPatch, "/api/execution-workspaces/"+*r.ExecutionWorkspaceID, body, nil); code < 300 {
			s.closes++
		} else {
			s.refused("closing workspace "+*r.ExecutionWorkspaceID, code)
		}
		s.reopen[rec.task.id] = reopening{workspace: *r.ExecutionWorkspaceID, since: time.Now()}
		return
	}
}

// reopenClosed reopens the tasks whose workspace close has finished (or was refused, or takes
// over a minute).
func (s *soak) reopenClosed(ctx context.Context) {
	for taskID, ro := range s.reopen {
		var ws struct {
			Status string `json:"status"`
		}
		code := s.call(ctx, http.MethodGet, "/api/execution-workspaces/"+ro.workspace, nil, &ws)
		if code == http.StatusOK && ws.Status == "closing" && time.Since(ro.since) < time.Minute {
			continue
		}
		if code == 0 || code == http.StatusServiceUnavailable {
			continue // ask again once the database answers
		}
		if s.call(ctx, http.MethodPatch, "/api/tasks/"+taskID, map[string]any{"status": "todo"}, nil) < 300 {
			delete(s.reopen, taskID)
		}
	}
}

// refused prints the first few refused close steps.
func (s *soak) refused(what string, code int) {
	if s.closeRefusals++; s.closeRefusals <= 3 {
		fmt.Printf("soak: %s: %d %.300s\n", what, code, s.lastRefusal)
	}
}

// settleRuns waits, with the worker running, until no run is live or the settle time is over.
func (s *soak) settleRuns(ctx context.Context) {
	if !s.worker.alive() {
		_ = s.startWorker()
	}
	_ = s.waitHealthy(ctx, 60*time.Second)
	for deadline := time.Now().Add(time.Minute); len(s.reopen) > 0 && time.Now().Before(deadline); {
		s.reopenClosed(ctx)
		time.Sleep(time.Second)
	}
	fmt.Printf("soak: load over (%d runs); letting them settle (at most %s)\n", len(s.runs), s.opts.settle)
	deadline := time.Now().Add(s.opts.settle)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		var live int
		err := s.pool.QueryRow(ctx, `SELECT count(*) FROM runs WHERE status IN ('queued', 'preparing', 'running')`).Scan(&live)
		if err == nil && live == 0 {
			// Finalize (releasing the lease, settling the workspace) follows the run's end.
			time.Sleep(10 * time.Second)
			return
		}
		time.Sleep(time.Second)
	}
}
