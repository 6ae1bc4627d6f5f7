package handlers

// Environment leases (docs/runs.md "Leases", docs/api.md "Leases"): which run holds which
// environment for which execution workspace, until when, under which generation, and what became of
// its cleanup.
//
// Reading: any reader of the lease's company (members and instance admins), through the JSON API
// per company and through the /leases pages, which gather every company the user can read.
// Writing: instance admins only. Force release ends a live lease and bumps its generation, so its
// holder is fenced out (its next heartbeat gets db.ErrFenced and the run stops); retry cleanup puts
// a lease whose cleanup failed back to pending. Both write their audit event and enqueue
// cleanup_lease (which stops what the run left running) in the transaction that makes the change.
// Refusals are audited as "<action>.denied"; another company's lease is the same 404 as a missing
// one.
//
// Lease rows never reach a response with a host path: provider_ref is not shown, and
// failure_reason (which can quote a cleanup error) has absolute paths replaced.

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"berth/db"
	"berth/jobs"
)

// leaseStatuses are the values the status filter accepts: every lease status, and "live" for
// acquiring, active and releasing together.
var leaseStatuses = []string{db.LeaseAcquiring, db.LeaseActive, db.LeaseReleasing, db.LeaseReleased,
	db.LeaseExpired, db.LeaseFailed}

// leaseQuery is a parsed lease list request: filters and one page's position.
type leaseQuery struct {
	// Statuses are the db.ListLeases status filters to merge: [""] for any status, ["live"], or
	// single statuses.
	Statuses      []string
	Status        string // the status parameter as normalized, for links and the form
	EnvironmentID string
	CompanyID     string // pages only: narrow /leases to one company
	Limit         int
	After         db.LeaseCursor
}

// parseLeaseQuery reads status (one value or a comma list), environment_id, limit and cursor.
func parseLeaseQuery(r *http.Request) (leaseQuery, error) {
	qs := r.URL.Query()
	limit, cursor, err := pageParams(r)
	if err != nil {
		return leaseQuery{}, err
	}
	q := leaseQuery{Limit: limit}
	if err := decodeCursor(cursor, &q.After); err != nil {
		return leaseQuery{}, err
	}
	if cursor != "" && (!db.ValidID(q.After.ID) || q.After.CreatedAt.IsZero()) {
		return leaseQuery{}, badRequest("bad_cursor", "The cursor is not valid; start again without it.")
	}
	if q.Statuses, q.Status, err = parseLeaseStatuses(qs.Get("status")); err != nil {
		return leaseQuery{}, err
	}
	if v := strings.TrimSpace(qs.Get("environment_id")); v != "" {
		if !db.ValidID(v) {
			return leaseQuery{}, badRequest("bad_environment_id", "environment_id must be an environment's id.")
		}
		q.EnvironmentID = strings.ToLower(v)
	}
	return q, nil
}

// parseLeaseStatuses turns "active,released" into the ListLeases filters to merge and the
// normalized parameter. Empty means any status.
func parseLeaseStatuses(raw string) (filters []string, normalized string, err error) {
	set := map[string]bool{}
	for v := range strings.SplitSeq(raw, ",") {
		v = strings.ToLower(strings.TrimSpace(v))
		switch {
		case v == "":
		case v == "live":
			for _, st := range db.LiveLeaseStatuses {
				set[st] = true
			}
		case slices.Contains(leaseStatuses, v):
			set[v] = true
		default:
			return nil, "", badRequest("bad_status",
				"status must be live or one of "+strings.Join(leaseStatuses, ", ")+", or a comma-separated list of them.")
		}
	}
	var chosen []string
	for _, st := range leaseStatuses { // in the lifecycle's order
		if set[st] {
			chosen = append(chosen, st)
		}
	}
	switch {
	case len(chosen) == 0:
		return []string{""}, "", nil
	case len(chosen) == len(leaseStatuses):
		return []string{""}, strings.Join(chosen, ","), nil
	case slices.Equal(chosen, db.LiveLeaseStatuses):
		return []string{"live"}, "live", nil
	}
	return chosen, strings.Join(chosen, ","), nil
}

// listLeases reads one page of the leases of the given companies, newest first (created_at, then
// id), with the cursor of the next page ("" on the last). db.ListLeases reads one company and one
// status filter at a time, so each (company, status) pair is read up to the page size plus one
// and the pieces are merged: the first limit+1 of the union are the first limit+1 overall.
func (s *Server) listLeases(ctx context.Context, companyIDs []string, q leaseQuery) ([]db.Lease, string, error) {
	var all []db.Lease
	for _, cid := range companyIDs {
		for _, st := range q.Statuses {
			part, err := s.leasesFrom(ctx, cid, st, q, q.Limit+1)
			if err != nil {
				return nil, "", err
			}
			all = append(all, part...)
		}
	}
	slices.SortFunc(all, func(a, b db.Lease) int {
		if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
			return c
		}
		return cmp.Compare(b.ID, a.ID) // lower-case hex text sorts as PostgreSQL sorts uuids
	})
	page, next := keysetPage(all, q.Limit, func(l db.Lease) any { return l.Cursor() })
	return page, next, nil
}

// leasesFrom reads up to n leases of one company and status filter after q's cursor, in as many
// db.ListLeases pages as it takes (each returns at most 200).
func (s *Server) leasesFrom(ctx context.Context, companyID, status string, q leaseQuery, n int) ([]db.Lease, error) {
	var out []db.Lease
	after := q.After
	for len(out) < n {
		want := min(n-len(out), maxPageLimit)
		part, err := db.ListLeases(ctx, s.pool, companyID, db.LeaseFilter{Status: status,
			EnvironmentID: q.EnvironmentID, After: after, Limit: want})
		if errors.Is(err, db.ErrInvalidID) {
			return nil, badRequest("bad_filter", "The environment or cursor is not valid.")
		}
		if err != nil {
			return nil, err
		}
		out = append(out, part...)
		if len(part) < want {
			break
		}
		after = part[len(part)-1].Cursor()
	}
	return out, nil
}

// leaseJSON is a lease as the API returns it. Absent ids and times are null; heartbeat_age_s is
// measured on the database clock.
type leaseJSON struct {
	ID                   string     `json:"id"`
	EnvironmentID        *string    `json:"environment_id"`
	ExecutionWorkspaceID *string    `json:"execution_workspace_id"`
	TaskID               *string    `json:"task_id"`
	RunID                *string    `json:"run_id"`
	Status               string     `json:"status"`
	Generation           int64      `json:"generation"`
	AcquiredAt           *time.Time `json:"acquired_at"`
	HeartbeatAt          *time.Time `json:"heartbeat_at"`
	HeartbeatAgeS        *int64     `json:"heartbeat_age_s"`
	ExpiresAt            *time.Time `json:"expires_at"`
	ReleasedAt           *time.Time `json:"released_at"`
	CleanupStatus        string     `json:"cleanup_status"`
	CleanupAttempts      int        `json:"cleanup_attempts"`
	FailureReason        *string    `json:"failure_reason"`
}

func newLeaseJSON(l db.Lease) leaseJSON {
	j := leaseJSON{ID: l.ID, EnvironmentID: optional(l.EnvironmentID), ExecutionWorkspaceID: optional(l.ExecutionWorkspaceID),
		TaskID: optional(l.TaskID), RunID: optional(l.RunID), Status: l.Status, Generation: l.Generation,
		AcquiredAt: utcPtr(l.AcquiredAt), HeartbeatAt: utcPtr(l.HeartbeatAt), ExpiresAt: utcPtr(l.ExpiresAt),
		ReleasedAt: utcPtr(l.ReleasedAt), CleanupStatus: l.CleanupStatus, CleanupAttempts: l.CleanupAttempts,
		FailureReason: optional(redactHostPaths(l.FailureReason))}
	if l.HeartbeatAt != nil {
		age := int64(max(l.HeartbeatAge(), 0) / time.Second)
		j.HeartbeatAgeS = &age
	}
	return j
}

// hostPathPattern finds absolute paths (and ~/ paths) in free text: a "/" at the start or after a
// space, quote, opening bracket, "=", ":" or ",", up to the next space, quote, bracket or comma.
var hostPathPattern = regexp.MustCompile(`(^|[\s"'(\[=:,])(~?/[^\s"'()\[\]<>,;]*)`)

// redactHostPaths replaces absolute host paths in a server-written message (a cleanup error can
// quote one) with "[path]", keeping a trailing ":" or "." that belongs to the sentence.
func redactHostPaths(s string) string {
	return hostPathPattern.ReplaceAllStringFunc(s, func(m string) string {
		sub := hostPathPattern.FindStringSubmatch(m)
		path := sub[2]
		trimmed := strings.TrimRight(path, ":.")
		if trimmed == "/" || trimmed == "" || trimmed == "~/" {
			return m // a lone slash is punctuation, not a path
		}
		return sub[1] + "[path]" + path[len(trimmed):]
	})
}

// apiListLeases is GET /api/companies/{cid}/leases?status=&environment_id=&limit=&cursor=: any
// reader of the company; newest first.
func (s *Server) apiListLeases(w http.ResponseWriter, r *http.Request, p *principal) error {
	a, err := s.companyAccess(r.Context(), p, r.PathValue("cid"))
	if err != nil {
		return err
	}
	q, err := parseLeaseQuery(r)
	if err != nil {
		return err
	}
	leases, next, err := s.listLeases(r.Context(), []string{a.Company.ID}, q)
	if err != nil {
		return err
	}
	out := listResponse[leaseJSON]{Items: make([]leaseJSON, 0, len(leases)), NextCursor: next}
	for _, l := range leases {
		out.Items = append(out.Items, newLeaseJSON(l))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// Errors of the administrator's lease actions.
var (
	errLeaseNotLive = &httpError{Status: http.StatusConflict, Code: "lease_not_live",
		Message: "The lease has already ended: there is nothing to release."}
	errLeaseCleanupNotFailed = &httpError{Status: http.StatusConflict, Code: "cleanup_not_failed",
		Message: "Only a lease whose cleanup failed can have its cleanup retried."}
	errLeaseJobsUnavailable = &httpError{Status: http.StatusServiceUnavailable, Code: "jobs_unavailable",
		Message: "This server cannot queue the cleanup job."}
)

// forceReleaseLease ends a company's live lease for an instance admin: released, generation + 1
// (the holder is fenced out), cleanup pending and asked for, audited as lease.force_released.
func (s *Server) forceReleaseLease(ctx context.Context, r *http.Request, a access, id string) (db.Lease, error) {
	if err := s.requireAdmin(r, a, "lease.force_release", "environment_lease", id); err != nil {
		return db.Lease{}, err
	}
	var l db.Lease
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		l, err = db.ForceReleaseLease(ctx, tx, a.Company.ID, id)
		if errors.Is(err, db.ErrLeaseState) {
			return errLeaseNotLive
		}
		if err != nil {
			return err
		}
		if err := s.enqueueLeaseCleanup(ctx, tx, l); err != nil {
			return err
		}
		return s.auditTx(ctx, tx, r, a, "lease.force_released", "environment_lease", id, map[string]any{
			"previous_generation": l.Generation - 1, "generation": l.Generation,
			"run_id": l.RunID, "environment_id": l.EnvironmentID, "execution_workspace_id": l.ExecutionWorkspaceID})
	})
	return l, err
}

// retryLeaseCleanup puts an ended lease whose cleanup failed back to pending for an instance
// admin and asks for the cleanup job, audited as lease.cleanup_retried. Any other cleanup state
// is a 409.
func (s *Server) retryLeaseCleanup(ctx context.Context, r *http.Request, a access, id string) (db.Lease, error) {
	if err := s.requireAdmin(r, a, "lease.retry_cleanup", "environment_lease", id); err != nil {
		return db.Lease{}, err
	}
	if s.jobs == nil {
		return db.Lease{}, errLeaseJobsUnavailable
	}
	var l db.Lease
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		l, err = db.RetryLeaseCleanup(ctx, tx, a.Company.ID, id)
		if errors.Is(err, db.ErrLeaseState) {
			return errLeaseCleanupNotFailed
		}
		if err != nil {
			return err
		}
		if err := s.enqueueLeaseCleanup(ctx, tx, l); err != nil {
			return err
		}
		return s.auditTx(ctx, tx, r, a, "lease.cleanup_retried", "environment_lease", id, map[string]any{
			"generation": l.Generation, "cleanup_attempts": l.CleanupAttempts})
	})
	return l, err
}

// enqueueLeaseCleanup asks, inside tx, for the cleanup_lease job of lease l (cleanup pending, at
// l.Generation): it stops what the lease's run left running and records the cleanup. Without a
// job client in this process nothing is enqueued; the lease stays pending and visible.
func (s *Server) enqueueLeaseCleanup(ctx context.Context, tx pgx.Tx, l db.Lease) error {
	if s.jobs == nil {
		return nil
	}
	_, err := jobs.Enqueue(ctx, s.jobs, tx, jobs.CleanupLeaseArgs{LeaseID: l.ID, Generation: l.Generation})
	return err
}

// apiForceReleaseLease is POST /api/leases/{id}/release (instance admins): 200 with the released
// lease. The body, if any, must be an empty JSON object.
func (s *Server) apiForceReleaseLease(w http.ResponseWriter, r *http.Request, p *principal) error {
	id := r.PathValue("id")
	a, err := s.objectAccess(r.Context(), p, "environment_leases", id)
	if err != nil {
		return err
	}
	if err := emptyJSONBody(w, r); err != nil {
		return err
	}
	l, err := s.forceReleaseLease(r.Context(), r, a, id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, newLeaseJSON(l))
	return nil
}

// apiRetryLeaseCleanup is POST /api/leases/{id}/retry-cleanup (instance admins): 202 with the
// lease, cleanup pending; the cleanup job runs later.
func (s *Server) apiRetryLeaseCleanup(w http.ResponseWriter, r *http.Request, p *principal) error {
	id := r.PathValue("id")
	a, err := s.objectAccess(r.Context(), p, "environment_leases", id)
	if err != nil {
		return err
	}
	if err := emptyJSONBody(w, r); err != nil {
		return err
	}
	l, err := s.retryLeaseCleanup(r.Context(), r, a, id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusAccepted, newLeaseJSON(l))
	return nil
}
