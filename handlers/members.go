package handlers

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"berth/db"
	"berth/views"
)

// errLastBoardMember refuses a change that would leave the company with nobody to manage it.
var errLastBoardMember = &httpError{Status: http.StatusConflict, Code: "last_board_member",
	Message: "A company needs at least one board member: make someone else board first."}

// memberInput is the body of POST …/members and the add-member form.
type memberInput struct {
	Email string `json:"email"`
	Role  string `json:"role"`
}

// validRole reports whether role is one a member may hold.
func validRole(role string) bool { return role == db.RoleBoard || role == db.RoleViewer }

// roleMessage is the field message for a role that is neither board nor viewer.
const roleMessage = `Choose "board" or "viewer".`

// validate checks the shape of the email and the role; whether the account exists is checked
// against the database.
func (in memberInput) validate() map[string]string {
	fields := map[string]string{}
	switch {
	case in.Email == "":
		fields["email"] = "Enter the email of the person to add."
	case len(in.Email) > 254 || !strings.Contains(in.Email, "@"):
		fields["email"] = "Enter an email address."
	}
	if !validRole(in.Role) {
		fields["role"] = roleMessage
	}
	return fields
}

// roleInput is the body of PATCH …/members/{user_id}.
type roleInput struct {
	Role string `json:"role"`
}

// memberJSON is a membership in API responses.
type memberJSON struct {
	CompanyID string    `json:"company_id"`
	UserID    string    `json:"user_id"`
	Email     string    `json:"email"`
	Role      string    `json:"role"`
	CreatedAt time.Time `json:"created_at"`
}

// memberResponse shapes a membership for the API.
func memberResponse(m db.Member) memberJSON {
	return memberJSON{CompanyID: m.CompanyID, UserID: m.UserID, Email: m.Email, Role: m.Role, CreatedAt: m.CreatedAt.UTC()}
}

// addMember adds an existing, enabled user to the company. An unknown email is a 422 that says
// how to create the account; a user who already belongs is a 409 already_member (roles change
// with PATCH). The caller has passed requireManage.
func (s *Server) addMember(ctx context.Context, r *http.Request, a access, in memberInput) (db.Member, error) {
	in = memberInput{Email: db.NormalizeEmail(in.Email), Role: strings.TrimSpace(in.Role)}
	if fields := in.validate(); len(fields) > 0 {
		return db.Member{}, invalid(fields)
	}
	var m db.Member
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		u, err := db.UserByEmail(ctx, tx, in.Email)
		if errors.Is(err, db.ErrNotFound) || err == nil && u.Disabled {
			return invalid(map[string]string{"email": "No active Berth account has this email. An operator creates one with: berth user add --email " +
				in.Email + " --company " + a.Company.Slug + " --role " + in.Role})
		}
		if err != nil {
			return err
		}
		if m, err = db.AddMember(ctx, tx, a.Company.ID, u.ID, in.Role); err != nil {
			return err
		}
		return s.auditTx(ctx, tx, r, a, "membership.created", "user", u.ID, map[string]any{"email": u.Email, "role": in.Role})
	})
	if errors.Is(err, db.ErrConflict) {
		return db.Member{}, &httpError{Status: http.StatusConflict, Code: "already_member",
			Message: "This person is already a member; change their role with PATCH /api/companies/{cid}/members/{user_id}.",
			Fields:  map[string]string{"email": "Already a member: change their role in the list instead."}}
	}
	if err != nil {
		return db.Member{}, err
	}
	return m, nil
}

// changeMemberRole sets a member's role; demoting the last board member is a 409. An unchanged
// role changes nothing and records nothing. The caller has passed requireManage.
func (s *Server) changeMemberRole(ctx context.Context, r *http.Request, a access, userID string, in roleInput) (db.Member, error) {
	role := strings.TrimSpace(in.Role)
	if !validRole(role) {
		return db.Member{}, invalid(map[string]string{"role": roleMessage})
	}
	var after db.Member
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		before, changed, err := db.ChangeMemberRole(ctx, tx, a.Company.ID, userID, role)
		if err != nil {
			return err
		}
		after = changed
		if before.Role == changed.Role {
			return nil
		}
		return s.auditTx(ctx, tx, r, a, "membership.updated", "user", userID,
			map[string]any{"email": before.Email, "from": before.Role, "to": changed.Role})
	})
	if errors.Is(err, db.ErrLastBoardMember) {
		return db.Member{}, errLastBoardMember
	}
	if err != nil {
		return db.Member{}, err
	}
	return after, nil
}

// removeMember takes a user out of the company; removing the last board member is a 409. The
// caller has passed requireManage.
func (s *Server) removeMember(ctx context.Context, r *http.Request, a access, userID string) error {
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		m, err := db.RemoveMember(ctx, tx, a.Company.ID, userID)
		if err != nil {
			return err
		}
		return s.auditTx(ctx, tx, r, a, "membership.deleted", "user", userID, map[string]any{"email": m.Email, "role": m.Role})
	})
	if errors.Is(err, db.ErrLastBoardMember) {
		return errLastBoardMember
	}
	return err
}

// memberCursor is the keyset position of a members list: the last email of a page.
type memberCursor struct {
	Email string `json:"e"`
}

// memberList is the company's members, in email order, for the API and the members page.
func (s *Server) memberList(a access) keysetList[db.Member, memberCursor] {
	return keysetList[db.Member, memberCursor]{
		fetch: func(ctx context.Context, after memberCursor, limit int) ([]db.Member, error) {
			return db.ListMembers(ctx, s.pool, a.Company.ID, after.Email, limit)
		},
		key: func(m db.Member) memberCursor { return memberCursor{Email: m.Email} },
	}
}

// apiListMembers is GET /api/companies/{cid}/members: any member or instance admin, by email.
func (s *Server) apiListMembers(w http.ResponseWriter, r *http.Request, p *principal) error {
	a, err := s.companyAccess(r.Context(), p, r.PathValue("cid"))
	if err != nil {
		return err
	}
	return serveKeyset(w, r, s.memberList(a), memberResponse)
}

// apiAddMember is POST /api/companies/{cid}/members {email, role}: board members; 201.
func (s *Server) apiAddMember(w http.ResponseWriter, r *http.Request, p *principal) error {
	a, err := s.managedCompany(r, p, "membership.create", "user", "")
	if err != nil {
		return err
	}
	var in memberInput
	if err := decodeJSON(w, r, &in); err != nil {
		return err
	}
	m, err := s.addMember(r.Context(), r, a, in)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, memberResponse(m))
	return nil
}

// apiChangeMemberRole is PATCH /api/companies/{cid}/members/{user_id} {role}: board members.
func (s *Server) apiChangeMemberRole(w http.ResponseWriter, r *http.Request, p *principal) error {
	userID := r.PathValue("user_id")
	a, err := s.managedCompany(r, p, "membership.update", "user", userID)
	if err != nil {
		return err
	}
	var in roleInput
	if err := decodeJSON(w, r, &in); err != nil {
		return err
	}
	m, err := s.changeMemberRole(r.Context(), r, a, userID, in)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, memberResponse(m))
	return nil
}

// apiRemoveMember is DELETE /api/companies/{cid}/members/{user_id}: board members; 204.
func (s *Server) apiRemoveMember(w http.ResponseWriter, r *http.Request, p *principal) error {
	userID := r.PathValue("user_id")
	a, err := s.managedCompany(r, p, "membership.delete", "user", userID)
	if err != nil {
		return err
	}
	if err := s.removeMember(r.Context(), r, a, userID); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// membersPageLimit is how many members one page of the members page lists.
const membersPageLimit = 100

// membersData loads what the members page shows for the caller.
func (s *Server) membersData(ctx context.Context, a access, cursor string) (views.MembersData, error) {
	ms, next, err := s.memberList(a).page(ctx, cursor, membersPageLimit)
	if err != nil {
		return views.MembersData{}, err
	}
	d := views.MembersData{CompanyID: a.Company.ID, CanManage: a.canManage(), SelfID: a.P.User.ID}
	for _, m := range ms {
		d.Members = append(d.Members, views.MemberRow{UserID: m.UserID, Email: m.Email, Role: m.Role, Since: m.CreatedAt})
	}
	if next != "" {
		d.NextURL = "/companies/" + a.Company.ID + "/members?cursor=" + url.QueryEscape(next)
	}
	return d, nil
}

// membersPage is GET /companies/{cid}/members: the list for any member or instance admin, with
// the add, change and remove forms for board members.
func (s *Server) membersPage(w http.ResponseWriter, r *http.Request, p *principal) error {
	a, err := s.companyAccess(r.Context(), p, r.PathValue("cid"))
	if err != nil {
		return err
	}
	d, err := s.membersData(r.Context(), a, r.URL.Query().Get("cursor"))
	if err != nil {
		return err
	}
	return s.render(w, r, views.MembersPage(s.companyFrame(r, a, "Members", "members"), d))
}

// addMemberForm is POST /companies/{cid}/members (form email, role): board members.
func (s *Server) addMemberForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	a, err := s.managedCompany(r, p, "membership.create", "user", "")
	if err != nil {
		return err
	}
	form, err := readForm(w, r, maxFormBody)
	if err != nil {
		return err
	}
	in := memberInput{Email: form.Get("email"), Role: form.Get("role")}
	_, err = s.addMember(r.Context(), r, a, in)
	return s.afterMemberChange(w, r, p, err, &views.MemberForm{Email: in.Email, Role: in.Role})
}

// changeMemberRoleForm is POST /companies/{cid}/members/{user_id}/role (form role): board members.
func (s *Server) changeMemberRoleForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	userID := r.PathValue("user_id")
	a, err := s.managedCompany(r, p, "membership.update", "user", userID)
	if err != nil {
		return err
	}
	form, err := readForm(w, r, maxFormBody)
	if err != nil {
		return err
	}
	_, err = s.changeMemberRole(r.Context(), r, a, userID, roleInput{Role: form.Get("role")})
	return s.afterMemberChange(w, r, p, err, nil)
}

// removeMemberForm is POST /companies/{cid}/members/{user_id}/remove: board members.
func (s *Server) removeMemberForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	userID := r.PathValue("user_id")
	a, err := s.managedCompany(r, p, "membership.delete", "user", userID)
	if err != nil {
		return err
	}
	err = s.removeMember(r.Context(), r, a, userID)
	return s.afterMemberChange(w, r, p, err, nil)
}

// afterMemberChange answers a members form. Success: htmx gets the refreshed section, a plain
// form a redirect to the page; a caller who removed themselves goes to the dashboard. A refusal
// (422, 409) shows the section again with its status: next to the add form's fields when form
// (what was typed in it) is given, else as an alert. Other errors go to the adapter.
func (s *Server) afterMemberChange(w http.ResponseWriter, r *http.Request, p *principal, err error, form *views.MemberForm) error {
	he, refused := formRefusal(err)
	if err != nil && !refused {
		return err
	}
	ctx := r.Context()
	a, err := s.companyAccess(ctx, p, r.PathValue("cid"))
	if errors.Is(err, errNotFound) {
		redirectAfterForm(w, r, "/")
		return nil
	}
	if err != nil {
		return err
	}
	if !refused && !isHTMX(r) {
		http.Redirect(w, r, "/companies/"+a.Company.ID+"/members", http.StatusSeeOther)
		return nil
	}
	d, err := s.membersData(ctx, a, "")
	if err != nil {
		return err
	}
	status := http.StatusOK
	if refused {
		status = he.Status
		d.Error = refusalMessage(he)
		if form != nil && len(he.Fields) > 0 {
			d.Error = ""
			d.Form = *form
			d.Form.Errors = he.Fields
		}
	}
	if isHTMX(r) {
		return s.renderStatus(w, r, status, views.MembersSection(d))
	}
	return s.renderStatus(w, r, status, views.MembersPage(s.companyFrame(r, a, "Members", "members"), d))
}
