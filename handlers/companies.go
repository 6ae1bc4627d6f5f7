package handlers

import (
	"context"
	"errors"
	"net/http"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"berth/db"
	"berth/views"
)

// companySlugPattern is the companies.slug CHECK of the foundation migration.
var companySlugPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// companyInput is the body of POST /api/companies and the fields of the create-company form.
type companyInput struct {
	Name string `json:"name"`
	Slug string `json:"slug"`
}

// normalized trims what people type around names and slugs.
func (in companyInput) normalized() companyInput {
	return companyInput{Name: strings.TrimSpace(in.Name), Slug: strings.TrimSpace(in.Slug)}
}

// validate applies the companies table's rules, one message per field.
func (in companyInput) validate() map[string]string {
	fields := map[string]string{}
	switch n := utf8.RuneCountInString(in.Name); {
	case n == 0:
		fields["name"] = "Enter a name."
	case n > 200:
		fields["name"] = "Use at most 200 characters."
	default:
		if msg := textProblem(in.Name); msg != "" {
			fields["name"] = "The name " + msg + "."
		}
	}
	if !companySlugPattern.MatchString(in.Slug) {
		fields["slug"] = "Use 1 to 63 lowercase letters, digits and dashes, starting with a letter or digit."
	}
	return fields
}

// companyJSON is a company in API responses; role is the caller's role in it, null for an
// instance admin who is not a member.
type companyJSON struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Slug      string    `json:"slug"`
	Role      *string   `json:"role"`
	CreatedAt time.Time `json:"created_at"`
}

// companyResponse shapes a company for the API, with the caller's role in it.
func companyResponse(c db.Company, role string) companyJSON {
	out := companyJSON{ID: c.ID, Name: c.Name, Slug: c.Slug, CreatedAt: c.CreatedAt.UTC()}
	if role != "" {
		out.Role = &role
	}
	return out
}

// createCompany creates a company with its creator as the first board member, so someone may
// manage it at once. A taken slug is a 409 slug_taken. The caller has passed requireAdmin.
func (s *Server) createCompany(ctx context.Context, r *http.Request, p *principal, in companyInput) (db.Company, error) {
	in = in.normalized()
	if fields := in.validate(); len(fields) > 0 {
		return db.Company{}, invalid(fields)
	}
	var c db.Company
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		if c, err = db.CreateCompany(ctx, tx, in.Name, in.Slug); err != nil {
			return err
		}
		if _, err := db.AddMember(ctx, tx, c.ID, p.User.ID, db.RoleBoard); err != nil {
			return err
		}
		a := access{Company: c, Role: db.RoleBoard, Admin: p.User.IsInstanceAdmin, P: p}
		if err := s.auditTx(ctx, tx, r, a, "company.created", "company", c.ID,
			map[string]any{"name": c.Name, "slug": c.Slug}); err != nil {
			return err
		}
		return s.auditTx(ctx, tx, r, a, "membership.created", "user", p.User.ID,
			map[string]any{"email": p.User.Email, "role": db.RoleBoard})
	})
	if errors.Is(err, db.ErrConflict) {
		return db.Company{}, &httpError{Status: http.StatusConflict, Code: "slug_taken",
			Message: "A company with this slug already exists.",
			Fields:  map[string]string{"slug": "This slug is taken; choose another."}}
	}
	if err != nil {
		return db.Company{}, err
	}
	return c, nil
}

// instanceAccess is the caller's standing for instance-level actions, which belong to no company.
func instanceAccess(p *principal) access {
	return access{Admin: p.User.IsInstanceAdmin, P: p}
}

// apiCreateCompany is POST /api/companies: instance admins only (others 403, audited).
func (s *Server) apiCreateCompany(w http.ResponseWriter, r *http.Request, p *principal) error {
	if err := s.requireAdmin(r, instanceAccess(p), "company.create", "company", ""); err != nil {
		return err
	}
	var in companyInput
	if err := decodeJSON(w, r, &in); err != nil {
		return err
	}
	c, err := s.createCompany(r.Context(), r, p, in)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, companyResponse(c, db.RoleBoard))
	return nil
}

// companyCursor is the keyset position of GET /api/companies: the last slug of a page.
type companyCursor struct {
	Slug string `json:"s"`
}

// apiListCompanies is GET /api/companies: the caller's companies (every company for an
// instance admin), in slug order.
func (s *Server) apiListCompanies(w http.ResponseWriter, r *http.Request, p *principal) error {
	companies := keysetList[db.VisibleCompany, companyCursor]{
		fetch: func(ctx context.Context, after companyCursor, limit int) ([]db.VisibleCompany, error) {
			return db.ListCompanies(ctx, s.pool, p.User.ID, p.User.IsInstanceAdmin, after.Slug, limit)
		},
		key: func(c db.VisibleCompany) companyCursor { return companyCursor{Slug: c.Slug} },
	}
	return serveKeyset(w, r, companies, func(c db.VisibleCompany) companyJSON { return companyResponse(c.Company, c.Role) })
}

// apiGetCompany is GET /api/companies/{cid}: any member or instance admin; anyone else 404.
func (s *Server) apiGetCompany(w http.ResponseWriter, r *http.Request, p *principal) error {
	a, err := s.companyAccess(r.Context(), p, r.PathValue("cid"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, companyResponse(a.Company, a.Role))
	return nil
}

// createCompanyForm is POST /companies, the dashboard's create-company form (instance admins).
// An empty slug is derived from the name. Success goes to the new company's page; a refusal
// shows the dashboard again with the form's messages.
func (s *Server) createCompanyForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	if err := s.requireAdmin(r, instanceAccess(p), "company.create", "company", ""); err != nil {
		return err
	}
	form, err := readForm(w, r, maxFormBody)
	if err != nil {
		return err
	}
	in := companyInput{Name: form.Get("name"), Slug: form.Get("slug")}
	if strings.TrimSpace(in.Slug) == "" {
		in.Slug = slugFrom(in.Name)
	}
	c, err := s.createCompany(r.Context(), r, p, in)
	if he, ok := formRefusal(err); ok {
		return s.renderDashboard(w, r, p, he.Status, views.CompanyForm{
			Name: in.Name, Slug: in.Slug, Errors: he.Fields, Error: he.Message})
	}
	if err != nil {
		return err
	}
	redirectAfterForm(w, r, "/companies/"+c.ID)
	return nil
}

// slugFrom derives a slug from a company name: lowercase ASCII letters and digits, every other
// run of characters a single dash, at most 63 characters.
func slugFrom(name string) string {
	var b strings.Builder
	dash := false
	for _, c := range strings.ToLower(name) {
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' {
			if dash && b.Len() > 0 {
				b.WriteByte('-')
			}
			dash = false
			b.WriteRune(c)
			continue
		}
		dash = true
	}
	slug := b.String()
	if len(slug) > 63 {
		slug = slug[:63]
	}
	return strings.TrimRight(slug, "-")
}
