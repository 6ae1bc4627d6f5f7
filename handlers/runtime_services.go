package handlers

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"berth/db"
	"berth/jobs"
	"berth/jobs/services"
)

// Runtime services of an execution workspace (docs/previews.md): the list shows one row per
// service its project workspace defines (never-started ones as stopped), and start, stop and
// restart record the wanted state and enqueue runtime_service in the same transaction (202; the
// same request again changes nothing). A run token controls its own workspace's services; a
// low-trust workspace has none.

var errServicesDenied = &httpError{Status: http.StatusForbidden, Code: "services_denied",
	Message: "This workspace's plan denies runtime services (low trust)."}

var errServicesNotReady = &httpError{Status: http.StatusConflict, Code: "workspace_not_ready",
	Message: "Services run only in a ready workspace."}

// runtimeServiceJSON is a service as the API shows it.
type runtimeServiceJSON struct {
	ID           string     `json:"id"`
	Name         string     `json:"name"`
	Status       string     `json:"status"`
	Health       string     `json:"health"`
	Port         *int       `json:"port"`
	URL          string     `json:"url"`
	DesiredState string     `json:"desired_state"`
	StopPolicy   string     `json:"stop_policy"`
	Lifecycle    string     `json:"lifecycle"`
	StartedAt    *time.Time `json:"started_at"`
	StoppedAt    *time.Time `json:"stopped_at"`
	ExitCode     *int       `json:"exit_code"`
	LogExcerpt   string     `json:"log_excerpt"`
	StopReason   *string    `json:"stop_reason"`
	Generation   int64      `json:"generation"`
	NodeID       *string    `json:"node_id"`
}

func (srv *Server) newRuntimeServiceJSON(s db.RuntimeService) runtimeServiceJSON {
	out := runtimeServiceJSON{ID: s.ID, Name: s.Name, Status: s.Reported(), Health: s.Health, URL: srv.preview.URL(s),
		DesiredState: s.DesiredState, StopPolicy: s.StopPolicy, Lifecycle: s.Lifecycle, StartedAt: utcPtr(s.StartedAt),
		StoppedAt: utcPtr(s.StoppedAt), ExitCode: s.ExitCode, LogExcerpt: s.LogExcerpt, StopReason: optional(s.StopReason),
		Generation: s.Generation, NodeID: optional(s.NodeID)}
	if s.Port > 0 {
		port := s.Port
		out.Port = &port
	}
	return out
}

// workspaceServices is one row per service the workspace's project workspace defines (rows are
// created, stopped, the first time they are listed, so every service has its id and URL), plus
// rows of services no longer defined that still have processes.
func (s *Server) workspaceServices(ctx context.Context, ws db.ExecutionWorkspace) ([]db.RuntimeService, error) {
	var defs []db.ServiceDefinition
	if ws.ProjectWorkspaceID != "" {
		pw, err := db.ProjectWorkspaceByID(ctx, s.pool, ws.CompanyID, ws.ProjectWorkspaceID)
		if err != nil && !errors.Is(err, db.ErrNotFound) {
			return nil, err
		}
		defs = pw.Services
	}
	rows, err := db.WorkspaceRuntimeServices(ctx, s.pool, ws.CompanyID, ws.ID)
	if err != nil {
		return nil, err
	}
	have := map[string]db.RuntimeService{}
	for _, r := range rows {
		have[r.Name] = r
	}
	out := make([]db.RuntimeService, 0, len(defs))
	defined := map[string]bool{}
	for _, d := range defs {
		defined[d.Name] = true
		r, ok := have[d.Name]
		if !ok {
			if r, err = db.EnsureRuntimeService(ctx, s.pool, ws.CompanyID, ws.ID, ws.ProjectWorkspaceID, d); err != nil {
				return nil, err
			}
		}
		out = append(out, r)
	}
	for _, r := range rows {
		if !defined[r.Name] && r.Live() {
			out = append(out, r)
		}
	}
	return out, nil
}

// listRuntimeServicesAPI is GET /api/execution-workspaces/{id}/runtime-services.
func (s *Server) listRuntimeServicesAPI(w http.ResponseWriter, r *http.Request, p *principal) error {
	_, ws, err := s.workspaceFor(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	list, err := s.workspaceServices(r.Context(), ws)
	if err != nil {
		return err
	}
	out := listResponse[runtimeServiceJSON]{Items: make([]runtimeServiceJSON, 0, len(list))}
	for _, sv := range list {
		out.Items = append(out.Items, s.newRuntimeServiceJSON(sv))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// runtimeServiceActionAPI is POST /api/execution-workspaces/{id}/runtime-services/{action}
// {name}: start, stop or restart → 202 with the service.
func (s *Server) runtimeServiceActionAPI(w http.ResponseWriter, r *http.Request, p *principal) error {
	action := r.PathValue("action")
	if action != jobs.ServiceStart && action != jobs.ServiceStop && action != jobs.ServiceRestart {
		return errNotFound
	}
	var body struct {
		Name string `json:"name"`
	}
	a, err := s.manageObjectOrRun(r, p, "execution_workspaces", r.PathValue("id"), "runtime_service."+action, "execution_workspace")
	if err != nil {
		return err
	}
	if err := decodeJSON(w, r, &body); err != nil {
		return err
	}
	if body.Name == "" {
		return invalid(map[string]string{"name": "is required"})
	}
	svc, err := s.controlService(r, a, r.PathValue("id"), body.Name, action)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusAccepted, s.newRuntimeServiceJSON(svc))
	return nil
}

// controlService records the wanted state of workspace wsID's service name and enqueues the
// step, in one transaction.
func (s *Server) controlService(r *http.Request, a access, wsID, name, action string) (db.RuntimeService, error) {
	ctx := r.Context()
	if s.jobs == nil {
		return db.RuntimeService{}, errRunsUnavailable
	}
	ws, err := db.ExecutionWorkspaceByID(ctx, s.pool, a.Company.ID, wsID)
	if err != nil {
		return db.RuntimeService{}, err
	}
	if ws.Trust == "low" {
		s.auditDenied(r, a, "runtime_service."+action, "execution_workspace", ws.ID)
		return db.RuntimeService{}, errServicesDenied
	}
	list, err := s.workspaceServices(ctx, ws)
	if err != nil {
		return db.RuntimeService{}, err
	}
	var svc db.RuntimeService
	for _, sv := range list {
		if sv.Name == name {
			svc = sv
		}
	}
	if svc.ID == "" {
		return db.RuntimeService{}, &httpError{Status: http.StatusNotFound, Code: "not_found", Message: "The workspace defines no service of that name."}
	}
	if action != jobs.ServiceStop && ws.Status != db.WorkspaceReady {
		return db.RuntimeService{}, errServicesNotReady
	}
	desired := db.DesiredRunning
	if action == jobs.ServiceStop {
		desired = db.DesiredStopped
	}
	runID := ""
	if a.P != nil && a.P.Run != nil {
		runID = a.P.Run.ID
	}
	err = db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		if svc, err = db.SetRuntimeServiceDesired(ctx, tx, svc.ID, desired, runID); err != nil {
			return err
		}
		if _, err := jobs.Enqueue(ctx, s.jobs, tx, jobs.RuntimeServiceArgs{ServiceID: svc.ID, Action: action, Reason: services.StopRequested}); err != nil {
			return err
		}
		return s.auditTx(ctx, tx, r, a, "runtime_service."+action, "runtime_service", svc.ID, map[string]any{"name": name})
	})
	return svc, err
}
