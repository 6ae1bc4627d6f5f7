package handlers

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/jackc/pgx/v5"

	"berth/db"
	"berth/jobs"
)

// Environment probes: an instance admin asks for one; the probe_environment job builds the
// environment's driver, probes it and writes the qualification. The request only enqueues.

// errProbeUnavailable is the 503 of a server without a job client to queue probes.
var errProbeUnavailable = &httpError{Status: http.StatusServiceUnavailable, Code: "jobs_unavailable",
	Message: "This server cannot queue probes."}

// probeEnvironment enqueues a probe of the environment with its audit event, in one transaction,
// and returns the environment as it is (the qualification is written later by the job). Only
// instance admins may; anyone else gets a 403 and an audited denial.
func (s *Server) probeEnvironment(ctx context.Context, r *http.Request, a access, id string) (db.Environment, error) {
	if err := s.requireAdmin(r, a, "environment.probe", "environment", id); err != nil {
		return db.Environment{}, err
	}
	if s.jobs == nil {
		return db.Environment{}, errProbeUnavailable
	}
	var env db.Environment
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		if env, err = db.LockEnvironment(ctx, tx, a.Company.ID, id); err != nil {
			return err
		}
		if _, err := jobs.Enqueue(ctx, s.jobs, tx, jobs.ProbeEnvironmentArgs{CompanyID: env.CompanyID, EnvironmentID: env.ID}); err != nil {
			return err
		}
		return s.auditTx(ctx, tx, r, a, "environment.probe_requested", "environment", env.ID,
			map[string]any{"driver": env.Driver})
	})
	return env, err
}

// apiProbeEnvironment is POST /api/environments/{id}/probe (instance admins): 202 with the
// environment; the body, if any, must be an empty JSON object. A qualification in it is refused
// by name: only the probe writes one.
func (s *Server) apiProbeEnvironment(w http.ResponseWriter, r *http.Request, p *principal) error {
	id := r.PathValue("id")
	a, err := s.adminObject(r, p, "environments", id, "environment.probe", "environment")
	if err != nil {
		return err
	}
	if r.ContentLength != 0 {
		var b struct {
			Qualification json.RawMessage `json:"qualification"`
		}
		if err := decodeJSON(w, r, &b); err != nil {
			return err
		}
		if b.Qualification != nil {
			return errServerOwned("qualification", "")
		}
	}
	env, err := s.probeEnvironment(r.Context(), r, a, id)
	if err != nil {
		return err
	}
	return writeEnvironment(w, http.StatusAccepted, env)
}

// probeEnvironmentForm is the page's "Probe" button: it enqueues a probe and sends the browser
// back to the environment's page (htmx: HX-Redirect), where the result shows once it is written.
func (s *Server) probeEnvironmentForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	id := r.PathValue("id")
	a, err := s.adminObject(r, p, "environments", id, "environment.probe", "environment")
	if err != nil {
		return err
	}
	form, err := readForm(w, r, maxFormBody)
	if err != nil {
		return err
	}
	for _, f := range []string{"qualification", "company_id", "id", "generation", "status"} {
		if form.Has(f) {
			return errServerOwned(f, "")
		}
	}
	if _, err := s.probeEnvironment(r.Context(), r, a, id); err != nil {
		return err
	}
	redirectAfterForm(w, r, "/environments/"+id)
	return nil
}
