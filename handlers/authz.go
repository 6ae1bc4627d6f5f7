package handlers

import (
	"context"
	"net/http"
	"strings"

	"berth/db"
)

// access is the caller's standing in one company. Instance admins read every company and manage
// environments and leases; board members manage their company's projects, tasks and members;
// viewers read; a run token reads its own task and execution workspace (Role roleRun). Anyone
// else gets the same 404 as for a missing object.
type access struct {
	Company db.Company
	Role    string // "board", "viewer", roleRun or "" (an instance admin who is not a member)
	Admin   bool
	P       *principal
}

// roleRun is the standing of a run token on its own task or execution workspace: it reads
// them, and may make the changes a route allows through manageObjectOrRun; it never manages.
const roleRun = "run"

// canRead reports whether the caller may see the company's objects.
func (a access) canRead() bool { return a.Role != "" || a.Admin }

// canManage reports whether the caller may change projects, tasks, bindings and members.
func (a access) canManage() bool { return a.Role == db.RoleBoard }

// companyAccess authorizes the caller for a company by id: not a member (and not an instance
// admin) or no such company → 404. A run token gets 404 for another company and 403 for its own:
// a run reaches its own task and workspace through objectAccess only, never a company listing.
func (s *Server) companyAccess(ctx context.Context, p *principal, companyID string) (access, error) {
	if !db.ValidID(companyID) {
		return access{}, errNotFound
	}
	if p.Run != nil {
		if strings.ToLower(companyID) != p.Run.Company.ID {
			return access{}, errNotFound
		}
		s.auditRunDenied(ctx, p, "company", map[string]any{"company_id": p.Run.Company.ID})
		return access{}, errRunTokenForbidden
	}
	c, role, err := db.CompanyRole(ctx, s.pool, companyID, p.User.ID)
	if err != nil {
		return access{}, err
	}
	a := access{Company: c, Role: role, Admin: p.User.IsInstanceAdmin, P: p}
	if !a.canRead() {
		return access{}, errNotFound
	}
	return a, nil
}

// objectAccess authorizes the caller for a company-owned row (a project, task, environment…) by
// its id, returning the caller's standing in the owning company. A run token: a missing row or
// another company's → the same 404 as for users; its own task ("tasks") or its own execution
// workspace ("execution_workspaces") → access with Role roleRun; any other row of its company →
// 403 (audited as run_token.denied).
func (s *Server) objectAccess(ctx context.Context, p *principal, table, id string) (access, error) {
	cid, err := db.CompanyOf(ctx, s.pool, table, id)
	if err != nil {
		return access{}, err
	}
	if p.Run != nil {
		return s.runObjectAccess(ctx, p, cid, table, id)
	}
	return s.companyAccess(ctx, p, cid)
}

// runObjectAccess is objectAccess for a run token, on a row of company cid.
func (s *Server) runObjectAccess(ctx context.Context, p *principal, cid, table, id string) (access, error) {
	if cid != p.Run.Company.ID {
		return access{}, errNotFound
	}
	if !p.Run.owns(table, id) {
		s.auditRunDenied(ctx, p, "object", map[string]any{"table": table, "id": strings.ToLower(id)})
		return access{}, errRunTokenForbidden
	}
	return access{Company: p.Run.Company, Role: roleRun, P: p}, nil
}

// requireManage refuses callers who may read but not manage, and audits the denial.
func (s *Server) requireManage(r *http.Request, a access, action, targetType, targetID string) error {
	if a.canManage() {
		return nil
	}
	s.auditDenied(r, a, action, targetType, targetID)
	return errForbidden
}

// requireAdmin refuses callers who are not instance admins, and audits the denial.
func (s *Server) requireAdmin(r *http.Request, a access, action, targetType, targetID string) error {
	if a.Admin {
		return nil
	}
	s.auditDenied(r, a, action, targetType, targetID)
	return &httpError{Status: http.StatusForbidden, Code: "forbidden", Message: "Only an instance administrator may do that."}
}

// auditDenied records a refused action in the company's audit trail.
func (s *Server) auditDenied(r *http.Request, a access, action, targetType, targetID string) {
	ctx, cancel := background(r.Context())
	defer cancel()
	s.audit(ctx, r, a.P, a.Company.ID, action+".denied", targetType, targetID, map[string]any{"role": a.Role})
}

// auditTx records a change inside the transaction that makes it.
func (s *Server) auditTx(ctx context.Context, q db.Querier, r *http.Request, a access, action, targetType, targetID string, details map[string]any) error {
	e := db.AuditEvent{CompanyID: a.Company.ID, ActorType: db.ActorUser, Action: action,
		TargetType: targetType, TargetID: targetID, Details: details, IP: clientIP(r)}
	if a.P != nil {
		e.ActorType, e.ActorID, e.ActorLabel = a.P.actor()
	}
	return db.InsertAudit(ctx, q, e)
}

// managedCompany authorizes a change in the company named by the path: a stranger gets 404, a
// viewer or an instance admin who is not a board member gets 403 (audited as action.denied).
func (s *Server) managedCompany(r *http.Request, p *principal, action, targetType, targetID string) (access, error) {
	a, err := s.companyAccess(r.Context(), p, r.PathValue("cid"))
	if err != nil {
		return access{}, err
	}
	if err := s.requireManage(r, a, action, targetType, targetID); err != nil {
		return access{}, err
	}
	return a, nil
}

// manageObjectOrRun is manageObject for the changes a run token may make to its own task or
// execution workspace (selecting the task's binding, controlling the workspace's runtime
// services): a run that objectAccess admitted (Role roleRun) may; users still need to manage.
func (s *Server) manageObjectOrRun(r *http.Request, p *principal, table, id, action, targetType string) (access, error) {
	a, err := s.objectAccess(r.Context(), p, table, id)
	if err != nil {
		return access{}, err
	}
	if a.Role == roleRun {
		return a, nil
	}
	if err := s.requireManage(r, a, action, targetType, id); err != nil {
		return access{}, err
	}
	return a, nil
}

// manageObject authorizes a change to a company-owned row by id: a reader who may not manage
// gets 403 (audited as action+".denied"); anyone else the same 404 as for a missing row.
func (s *Server) manageObject(r *http.Request, p *principal, table, id, action, targetType string) (access, error) {
	a, err := s.objectAccess(r.Context(), p, table, id)
	if err != nil {
		return access{}, err
	}
	if err := s.requireManage(r, a, action, targetType, id); err != nil {
		return access{}, err
	}
	return a, nil
}

// adminObject authorizes an instance-admin change to a company-owned row by id: a reader who is
// not an instance admin gets 403 (audited as action+".denied"), before any body is read; anyone
// else the same 404 as for a missing row.
func (s *Server) adminObject(r *http.Request, p *principal, table, id, action, targetType string) (access, error) {
	a, err := s.objectAccess(r.Context(), p, table, id)
	if err != nil {
		return access{}, err
	}
	if err := s.requireAdmin(r, a, action, targetType, id); err != nil {
		return access{}, err
	}
	return a, nil
}

// getObjectAPI is the GET handler of one company-owned row: a caller who may not read the owning
// company gets the same 404 as for a missing row; load reads the row within that company and out
// shapes it for the API.
func getObjectAPI[T, J any](s *Server, table string, load func(context.Context, db.Querier, string, string) (T, error),
	out func(T) J) func(http.ResponseWriter, *http.Request, *principal) error {
	return func(w http.ResponseWriter, r *http.Request, p *principal) error {
		id := r.PathValue("id")
		a, err := s.objectAccess(r.Context(), p, table, id)
		if err != nil {
			return err
		}
		v, err := load(r.Context(), s.pool, a.Company.ID, id)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, out(v))
		return nil
	}
}
