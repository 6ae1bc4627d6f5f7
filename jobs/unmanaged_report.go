package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"berth/db"
)

// The unmanaged-directory report, part of every orphan sweep: what lies under this node's managed
// workspace base without an owner is reported as an audit event, shown at /admin/workspaces, and
// never deleted (docs/runs.md "Crash recovery").

const (
	// unmanagedAction is the audit action of a report.
	unmanagedAction = "workspace.unmanaged_reported"
	// unmanagedMinAge: an entry under the managed base is reported only once it is this old, so a
	// realization in flight is not.
	unmanagedMinAge = 10 * time.Minute
	// reportCap bounds the names one unmanaged report lists.
	reportCap = 100
	// unmanagedReminder: a process that starts when its node's last report is older than this
	// writes the report again, as a reminder, even when nothing changed.
	unmanagedReminder = 30 * 24 * time.Hour
)

// UnmanagedMemo is what one process remembers of its node's unmanaged reports: the last one it
// wrote or read, so each sweep does not read it from the database again, and the lock that makes
// reports one at a time. Give every sweep of a process the same one (Deps.Unmanaged).
type UnmanagedMemo struct {
	mu    sync.Mutex // one unmanaged report at a time; guards last and known
	last  unmanagedReport
	known bool
}

// unmanagedReport is the details of a workspace.unmanaged_reported audit event: names only
// (opaque refs and entry names under the managed base), never host paths.
type unmanagedReport struct {
	Node            string   `json:"node"`
	Unmanaged       []string `json:"unmanaged"`
	UnmanagedCount  int      `json:"unmanaged_count"`
	Unrecorded      []string `json:"unrecorded"`
	UnrecordedCount int      `json:"unrecorded_count"`
}

// details is the report as audit event details.
func (r unmanagedReport) details() (map[string]any, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	var details map[string]any
	if err := json.Unmarshal(b, &details); err != nil {
		return nil, err
	}
	return details, nil
}

// same reports whether two reports list the same entries.
func (r unmanagedReport) same(o unmanagedReport) bool {
	return slices.Equal(r.Unmanaged, o.Unmanaged) && slices.Equal(r.Unrecorded, o.Unrecorded) &&
		r.UnmanagedCount == o.UnmanagedCount && r.UnrecordedCount == o.UnrecordedCount
}

// reportUnmanaged records, as an instance-level workspace.unmanaged_reported audit event, what
// lies under this node's managed base without an owner: entries no manager record owns, and
// workspaces the manager records that have no execution_workspaces row. Nothing is deleted. An
// event is written only when the set differs from the last one this node reported (an empty
// set after a non-empty one included). Skipped while a realization on this node is between
// creating its directory and recording its row.
func (s *sweeper) reportUnmanaged(ctx context.Context) error {
	m, memo := s.deps.Workspaces, s.deps.Unmanaged
	if m == nil || memo == nil || s.deps.NodeID == "" {
		return nil
	}
	memo.mu.Lock()
	defer memo.mu.Unlock()
	inflight, err := db.NodeRealizing(ctx, s.deps.Pool, s.deps.NodeID)
	if err != nil {
		return fmt.Errorf("unmanaged report: %w", err)
	}
	if inflight {
		return nil
	}
	names, err := m.Unmanaged(ctx)
	if err != nil {
		return fmt.Errorf("unmanaged report: %w", err)
	}
	listing, err := m.List(ctx)
	if err != nil {
		return fmt.Errorf("unmanaged report: %w", err)
	}
	rep := unmanagedReport{Node: s.deps.NodeID, Unmanaged: []string{}, Unrecorded: []string{}}
	for _, n := range names {
		if fi, err := os.Lstat(filepath.Join(m.Base(), n)); err == nil && time.Since(fi.ModTime()) >= unmanagedMinAge {
			rep.Unmanaged = append(rep.Unmanaged, n)
		}
	}
	refs := make([]string, 0, len(listing))
	for _, l := range listing {
		refs = append(refs, l.Ref)
	}
	if rep.Unrecorded, err = db.UnrecordedRefs(ctx, s.deps.Pool, refs); err != nil {
		return fmt.Errorf("unmanaged report: %w", err)
	}
	slices.Sort(rep.Unmanaged)
	rep.UnmanagedCount, rep.UnrecordedCount = len(rep.Unmanaged), len(rep.Unrecorded)
	rep.Unmanaged = rep.Unmanaged[:min(len(rep.Unmanaged), reportCap)]
	if rep.Unrecorded == nil {
		rep.Unrecorded = []string{}
	}
	rep.Unrecorded = rep.Unrecorded[:min(len(rep.Unrecorded), reportCap)]

	last, known := memo.last, memo.known
	if !known {
		if last, err = lastUnmanagedReport(ctx, s.deps.Pool, s.deps.NodeID); err != nil {
			return err
		}
	}
	if rep.same(last) {
		memo.last, memo.known = rep, true
		return nil
	}
	details, err := rep.details()
	if err != nil {
		return fmt.Errorf("unmanaged report: %w", err)
	}
	if err := db.InsertAudit(ctx, s.deps.Pool, db.AuditEvent{ActorType: db.ActorSystem, ActorLabel: "orphan sweep",
		Action: unmanagedAction, TargetType: "node", TargetID: s.deps.NodeID, Details: details}); err != nil {
		return fmt.Errorf("unmanaged report: %w", err)
	}
	memo.last, memo.known = rep, true
	s.log.Warn("entries under the managed workspace base have no owner (reported, not deleted)",
		"unmanaged", rep.UnmanagedCount, "unrecorded", rep.UnrecordedCount)
	return nil
}

// lastUnmanagedReport reads the latest report this node wrote within unmanagedReminder (an empty
// one if none; an older one is repeated once as a reminder).
func lastUnmanagedReport(ctx context.Context, q db.Querier, node string) (unmanagedReport, error) {
	rep := unmanagedReport{Node: node, Unmanaged: []string{}, Unrecorded: []string{}}
	b, err := db.LatestAuditDetails(ctx, q, unmanagedAction, "node", node, unmanagedReminder)
	if errors.Is(err, db.ErrNotFound) {
		return rep, nil
	}
	if err != nil {
		return rep, fmt.Errorf("last unmanaged report: %w", err)
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		return rep, fmt.Errorf("last unmanaged report: %w", err)
	}
	return rep, nil
}
