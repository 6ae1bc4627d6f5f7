package handlers

import (
	"context"
	"net/http"

	"berth/db"
	"berth/environment"
	"berth/jobs"
	"berth/views"
)

// The services panel of an execution workspace's page and its Start, Stop and Restart buttons,
// which go through the same controlService as the API.

// serviceLogTail is how much of a live service's log the panel shows.
const serviceLogTail = 4096

// servicesPanelData reads the services panel of workspace ws.
func (s *Server) servicesPanelData(ctx context.Context, a access, ws db.ExecutionWorkspace) (views.ServicesPanelData, error) {
	d := views.ServicesPanelData{WorkspaceID: ws.ID, Denied: ws.Trust == "low"}
	if d.Denied {
		return d, nil
	}
	list, err := s.workspaceServices(ctx, ws)
	if err != nil {
		return d, err
	}
	canControl := a.canManage() && s.jobs != nil && ws.Status == db.WorkspaceReady
	for _, sv := range list {
		row := s.runtimeServiceRow(sv, canControl)
		if row.LogExcerpt == "" && sv.LogPath != "" && sv.Live() {
			row.LogExcerpt, _ = environment.LogTail(sv.LogPath, serviceLogTail)
		}
		d.Rows = append(d.Rows, row)
	}
	return d, nil
}

// runtimeServiceForm is POST /workspaces/{id}/services/{name}/{action} from the services panel
// (or the Start button of a preview's page, with next): htmx gets the refreshed panel, a plain
// browser goes back to the workspace page (or next). A refusal (a workspace that is not ready)
// is shown in the panel with its own status.
func (s *Server) runtimeServiceForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	action := r.PathValue("action")
	if action != jobs.ServiceStart && action != jobs.ServiceStop && action != jobs.ServiceRestart {
		return errNotFound
	}
	id := r.PathValue("id")
	a, err := s.manageObject(r, p, "execution_workspaces", id, "runtime_service."+action, "execution_workspace")
	if err != nil {
		return err
	}
	if _, err := readForm(w, r, maxFormBody); err != nil {
		return err
	}
	_, err = s.controlService(r, a, id, r.PathValue("name"), action)
	he, refused := formRefusal(err)
	if err != nil && !refused {
		return err
	}
	if !refused && !isHTMX(r) {
		back := "/workspaces/" + id
		if next := r.PostForm.Get("next"); localPath(next) {
			back = next
		}
		redirectAfterForm(w, r, back)
		return nil
	}
	ws, err := db.ExecutionWorkspaceByID(ctx, s.pool, a.Company.ID, id)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if refused {
		status = he.Status
	}
	if isHTMX(r) {
		d, err := s.servicesPanelData(ctx, a, ws)
		if err != nil {
			return err
		}
		if refused {
			d.Notice = refusalMessage(he)
		}
		return s.renderStatus(w, r, status, views.ServicesPanel(d))
	}
	d, err := s.workspacePageData(ctx, a, ws, false)
	if err != nil {
		return err
	}
	d.Services.Notice = refusalMessage(he)
	return s.renderStatus(w, r, status, views.WorkspacePage(s.companyFrame(r, a, "Workspace "+shortRef(ws.Ref), "workspaces"), d))
}

// localPath reports whether next is a path on this site (not //host, not a URL), short enough.
func localPath(next string) bool {
	return next != "" && len(next) < 200 && next[0] == '/' && (len(next) < 2 || next[1] != '/' && next[1] != '\\')
}
