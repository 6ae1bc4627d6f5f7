package handlers

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"berth/db"
	"berth/views"
)

// maxRequestKey is the longest request key a binding change may carry.
const maxRequestKey = 200

// bindingJSON is a task's workspace binding in the JSON API (docs/api.md "Workspace binding").
// A never-bound task has revision 0, mode inherit and nulls.
type bindingJSON struct {
	TaskID               string     `json:"task_id"`
	Mode                 string     `json:"mode"`
	ExecutionWorkspaceID *string    `json:"execution_workspace_id"`
	Revision             int64      `json:"revision"`
	RequestKey           *string    `json:"request_key"`
	UpdatedAt            *time.Time `json:"updated_at"`
}

func newBindingJSON(b db.Binding) bindingJSON {
	out := bindingJSON{TaskID: b.TaskID, Mode: b.Mode, ExecutionWorkspaceID: optional(b.ExecutionWorkspaceID),
		Revision: b.Revision, RequestKey: optional(b.RequestKey)}
	if !b.UpdatedAt.IsZero() {
		at := b.UpdatedAt.UTC()
		out.UpdatedAt = &at
	}
	return out
}

// bindingRequest is the body of PUT /api/tasks/{id}/workspace (and the binding form's fields).
type bindingRequest struct {
	Mode                 string  `json:"mode"`
	ExecutionWorkspaceID *string `json:"execution_workspace_id"`
	Revision             *int64  `json:"revision"`
	RequestKey           string  `json:"request_key"`
}

// workspaceID is the selected workspace, lower-cased, or "".
func (in bindingRequest) workspaceID() string {
	if in.ExecutionWorkspaceID == nil {
		return ""
	}
	return strings.ToLower(strings.TrimSpace(*in.ExecutionWorkspaceID))
}

// validate checks the request's shape; whether the workspace is selectable is checked in the
// transaction.
func (in bindingRequest) validate() map[string]string {
	errs := map[string]string{}
	ws := in.workspaceID()
	switch {
	case !slices.Contains(db.TaskWorkspaceModes, in.Mode):
		errs["mode"] = "Must be one of " + strings.Join(db.TaskWorkspaceModes, ", ") + "."
	case in.Mode == "reuse" && ws == "":
		errs["execution_workspace_id"] = "Reuse needs a workspace: choose one of this project's workspaces."
	case in.Mode != "reuse" && ws != "":
		errs["execution_workspace_id"] = "Only the reuse mode selects a workspace; leave it empty or choose reuse."
	}
	if ws != "" && !db.ValidID(ws) {
		errs["execution_workspace_id"] = errNoSelectableWorkspace
	}
	switch {
	case in.Revision == nil:
		errs["revision"] = "Required: the revision you are changing (0 for a never-bound task)."
	case *in.Revision < 0:
		errs["revision"] = "Must be 0 or more."
	}
	switch {
	case in.RequestKey == "":
		errs["request_key"] = "Required: a key that identifies this change, so a retry is safe."
	case utf8.RuneCountInString(in.RequestKey) > maxRequestKey:
		errs["request_key"] = "At most 200 characters."
	case !utf8.ValidString(in.RequestKey) || strings.ContainsRune(in.RequestKey, 0):
		errs["request_key"] = "Contains characters that cannot be stored."
	}
	return errs
}

const errNoSelectableWorkspace = "No such execution workspace in this project."

// hash is the canonical digest of the request's body, to tell a replay from a reused key.
func (in bindingRequest) hash() []byte {
	canon, _ := json.Marshal(struct {
		Mode      string `json:"mode"`
		Workspace string `json:"execution_workspace_id"`
		Revision  int64  `json:"revision"`
	}{in.Mode, in.workspaceID(), *in.Revision})
	sum := sha256.Sum256(canon)
	return sum[:]
}

// bindingTargetProblem says why a task may not select a workspace, or "" when it may: it must
// belong to the task's project, share its trust level, and not be failed, closing or closed.
func bindingTargetProblem(t db.Task, w db.BindingWorkspace) string {
	switch {
	case w.ProjectID != t.ProjectID:
		return "That workspace belongs to another project."
	case w.Trust != t.Trust:
		return "That workspace was made for " + w.Trust + "-trust work; this task is " + t.Trust + " trust."
	case slices.Contains(db.UnselectableStatuses, w.Status):
		return "That workspace is " + w.Status + "; choose an open one."
	}
	return ""
}

// putBinding applies a binding change under the task's row lock. A request key seen before
// replays its stored answer when the body matches (whatever the revision now is) and is a 409
// otherwise; a revision other than the current one is a 409 carrying the current binding. An
// accepted change bumps the revision, is remembered by its key and audited, all in one
// transaction; it applies at the task's next run.
func (s *Server) putBinding(ctx context.Context, r *http.Request, a access, taskID string, in bindingRequest) (bindingJSON, error) {
	if errs := in.validate(); len(errs) > 0 {
		return bindingJSON{}, invalid(errs)
	}
	hash := in.hash()
	var out bindingJSON
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		t, err := db.LockTask(ctx, tx, a.Company.ID, taskID)
		if err != nil {
			return err
		}
		prev, err := db.BindingRequestByKey(ctx, tx, a.Company.ID, taskID, in.RequestKey)
		switch {
		case err == nil && bytes.Equal(prev.Hash, hash):
			if err := json.Unmarshal(prev.Response, &out); err != nil {
				return fmt.Errorf("replay binding request: %w", err)
			}
			return nil
		case err == nil:
			return &httpError{Status: http.StatusConflict, Code: "request_key_reused",
				Message: "This request key was already used for a different change; send a new key."}
		case !errors.Is(err, db.ErrNotFound):
			return err
		}
		if t.ProjectStatus != db.ProjectActive {
			return errTaskProjectArchived
		}
		cur, err := db.TaskBinding(ctx, tx, a.Company.ID, taskID)
		if err != nil {
			return err
		}
		if *in.Revision != cur.Revision {
			return &httpError{Status: http.StatusConflict, Code: "stale_revision",
				Message: "The binding changed since revision " + strconv.FormatInt(*in.Revision, 10) + "; review the current binding and try again.",
				Extra:   map[string]any{"current": newBindingJSON(cur)}}
		}
		if err := s.checkBindingTarget(ctx, tx, a, t, in.workspaceID()); err != nil {
			return err
		}
		next := db.Binding{TaskID: taskID, Mode: in.Mode, ExecutionWorkspaceID: in.workspaceID(),
			Revision: cur.Revision + 1, RequestKey: in.RequestKey}
		saved, err := db.SaveBinding(ctx, tx, a.Company.ID, a.P.User.ID, next, hash)
		if err != nil {
			return err
		}
		out = newBindingJSON(saved)
		resp, err := json.Marshal(out)
		if err != nil {
			return fmt.Errorf("binding response: %w", err)
		}
		if err := db.SaveBindingRequest(ctx, tx, taskID, in.RequestKey, db.BindingRequest{Hash: hash, Response: resp}); err != nil {
			return err
		}
		return s.auditTx(ctx, tx, r, a, "task_binding.updated", "task", taskID, map[string]any{
			"key": t.Key, "from_mode": cur.Mode, "to_mode": saved.Mode,
			"from_workspace_id": optional(cur.ExecutionWorkspaceID), "to_workspace_id": optional(saved.ExecutionWorkspaceID),
			"revision": saved.Revision, "request_key": saved.RequestKey,
		})
	})
	return out, err
}

// checkBindingTarget refuses (422) a workspace the task may not select; another company's
// workspace reads as missing.
func (s *Server) checkBindingTarget(ctx context.Context, q db.Querier, a access, t db.Task, wsID string) error {
	if wsID == "" {
		return nil
	}
	w, err := db.BindingWorkspaceByID(ctx, q, a.Company.ID, wsID)
	if errors.Is(err, db.ErrNotFound) {
		return invalid(map[string]string{"execution_workspace_id": errNoSelectableWorkspace})
	}
	if err != nil {
		return err
	}
	if msg := bindingTargetProblem(t, w); msg != "" {
		return invalid(map[string]string{"execution_workspace_id": msg})
	}
	return refuseSealed(ctx, q, a, wsID) // a sealed attempt takes no binding (attempts.go)
}

// getBindingAPI returns a task's workspace binding.
func (s *Server) getBindingAPI(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx, id := r.Context(), r.PathValue("id")
	a, err := s.objectAccess(ctx, p, "tasks", id)
	if err != nil {
		return err
	}
	b, err := db.TaskBinding(ctx, s.pool, a.Company.ID, id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, newBindingJSON(b))
	return nil
}

// putBindingAPI changes a task's workspace binding (board members, and a live run's token for
// its own task): 200 with the new binding.
func (s *Server) putBindingAPI(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx, id := r.Context(), r.PathValue("id")
	a, err := s.manageObjectOrRun(r, p, "tasks", id, "task_binding.update", "task")
	if err != nil {
		return err
	}
	var in bindingRequest
	if err := decodeJSON(w, r, &in); err != nil {
		return err
	}
	// A run acts on its own workspace only (DESIGN §14): it may pick a mode, or its own
	// workspace, never another task's.
	if p.Run != nil {
		if ws := in.workspaceID(); ws != "" && ws != strings.ToLower(p.Run.WorkspaceID) {
			s.auditRunDenied(ctx, p, "binding_workspace", map[string]any{"execution_workspace_id": ws})
			return errForbidden
		}
	}
	out, err := s.putBinding(ctx, r, a, id, in)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// newBindingRequestKey is a fresh request key for one rendering of the binding form, so submitting
// that form twice is one change.
func newBindingRequestKey() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return "form-" + hex.EncodeToString(b)
}

// bindingView is the binding panel for a task: the current binding and, for board members of an
// active project, the form with the selectable workspaces and a fresh request key.
func (s *Server) bindingView(ctx context.Context, a access, snap db.PlanSnapshot) (views.BindingView, error) {
	b := snap.Binding
	v := views.BindingView{TaskID: snap.Task.ID, Mode: b.Mode, Revision: b.Revision, UpdatedAt: b.UpdatedAt,
		CanManage: a.canManage() && snap.Task.ProjectStatus == db.ProjectActive,
		FormMode:  b.Mode, FormWorkspace: b.ExecutionWorkspaceID, RequestKey: newBindingRequestKey()}
	if b.ExecutionWorkspaceID != "" {
		v.Workspace = b.ExecutionWorkspaceID
		if snap.Target != nil {
			v.Workspace = bindingWorkspaceLabel(*snap.Target)
		}
	}
	if !v.CanManage {
		return v, nil
	}
	ws, err := db.SelectableWorkspaces(ctx, s.pool, a.Company.ID, snap.Task.ProjectID, snap.Task.Trust, 100)
	if err != nil {
		return views.BindingView{}, err
	}
	for _, w := range ws {
		v.Options = append(v.Options, views.TaskOption{Value: w.ID, Label: bindingWorkspaceLabel(w)})
	}
	return v, nil
}

// bindingFormError turns a refused binding change into the panel's message and the status the
// panel or page answers with; errors that are not the caller's to fix come back as err.
func bindingFormError(err error, v *views.BindingView) (int, error) {
	he, ok := formRefusal(err)
	if !ok {
		return 0, err
	}
	v.NoticeError = true
	if fields, ok := asValidation(err); ok {
		v.Errors, v.Notice = fields, "The binding was not changed: fix the marked fields."
		return he.Status, nil
	}
	switch he.Code {
	case "stale_revision":
		v.Notice = "Someone changed the binding while you were choosing; it is now revision " +
			strconv.FormatInt(v.Revision, 10) + ". Review it and save again."
	case "request_key_reused":
		v.Notice = "This form was already used for a different choice. It has been refreshed; save again."
	default:
		v.Notice = he.Message
	}
	return he.Status, nil
}

// bindingForm changes the binding from the task page (board members). htmx gets the panel back
// (a refused change re-rendered with the current binding and a message, with the refusal's
// status, 422 or 409, which app.js swaps) and, on success, a plan-changed event so the plan panel
// refreshes; without JavaScript a success redirects to the task page and a refusal re-renders
// the whole page.
func (s *Server) bindingForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx, id := r.Context(), r.PathValue("id")
	a, err := s.manageObject(r, p, "tasks", id, "task_binding.update", "task")
	if err != nil {
		return err
	}
	form, err := readForm(w, r, maxTextFormBody)
	if err != nil {
		return err
	}
	in := bindingRequest{Mode: form.Get("mode"), RequestKey: form.Get("request_key")}
	if ws := form.Get("execution_workspace_id"); ws != "" {
		in.ExecutionWorkspaceID = &ws
	}
	if rev, convErr := strconv.ParseInt(form.Get("revision"), 10, 64); convErr == nil {
		in.Revision = &rev
	}
	_, putErr := s.putBinding(ctx, r, a, id, in)

	snap, err := db.LoadPlanSnapshot(ctx, s.pool, a.Company.ID, id)
	if err != nil {
		return err
	}
	v, err := s.bindingView(ctx, a, snap)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if putErr == nil {
		v.Notice = "Saved as revision " + strconv.FormatInt(v.Revision, 10) + ". It applies at the task's next run."
	} else {
		if status, err = bindingFormError(putErr, &v); err != nil {
			return err
		}
		if _, ok := asValidation(putErr); ok {
			v.FormMode, v.FormWorkspace = in.Mode, in.workspaceID()
		}
	}
	if taskFragmentRequest(r) {
		if putErr == nil {
			w.Header().Set("HX-Trigger", "plan-changed")
		}
		return s.renderStatus(w, r, status, views.BindingPanel(v))
	}
	if putErr == nil {
		http.Redirect(w, r, "/tasks/"+id+"#binding", http.StatusSeeOther)
		return nil
	}
	page, err := s.taskPageData(ctx, a, snap)
	if err != nil {
		return err
	}
	page.Binding = v
	return s.renderStatus(w, r, status, views.TaskPage(s.taskFrame(r, a, snap.Task), page))
}
