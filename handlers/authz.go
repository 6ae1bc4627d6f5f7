package handlers

import (
	"context"
	"errors"
	"net/http"

	"berth/db"
)

// access is the caller's standing in one company. Instance admins read every company and manage
// environments and leases; board members manage their company's projects, tasks and members;
// viewers read. Anyone else gets the same 404 as for a missing object.
type access struct {
	Company db.Company
	Role    string // "board", "viewer" or "" (an instance admin who is not a member)
	Admin   bool
	P       *principal
}

// canRead reports whether the caller may see the company's objects.
func (a access) canRead() bool { return a.Role != "" || a.Admin }

// canManage reports whether the caller may change projects, tasks, bindings and members.
func (a access) canManage() bool { return a.Role == db.RoleBoard }

// companyAccess authorizes the caller for a company by id: not a member (and not an instance
// admin) or no such company → 404.
func (s *Server) companyAccess(ctx context.Context, p *principal, companyID string) (access, error) {
	if !db.ValidID(companyID) {
		return access{}, errNotFound
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
// its id, returning the caller's standing in the owning company.
func (s *Server) objectAccess(ctx context.Context, p *principal, table, id string) (access, error) {
	cid, err := db.CompanyOf(ctx, s.pool, table, id)
	if err != nil {
		return access{}, err
	}
	return s.companyAccess(ctx, p, cid)
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
		e.ActorID, e.ActorLabel = a.P.User.ID, a.P.User.Email
	}
	return db.InsertAudit(ctx, q, e)
}

// invalid is a 422 with one message per offending field.
func invalid(fields map[string]string) error {
	return &httpError{Status: http.StatusUnprocessableEntity, Code: "validation_failed",
		Message: "Some fields are not valid.", Fields: fields}
}

// asValidation extracts field errors from err, for forms that re-render with messages.
func asValidation(err error) (map[string]string, bool) {
	var he *httpError
	if errors.As(err, &he) && he.Code == "validation_failed" {
		return he.Fields, true
	}
	return nil, false
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
