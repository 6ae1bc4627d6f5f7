package handlers

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"berth/db"
	"berth/environment"
)

// Environments in the JSON API: the redacted object, the POST and PATCH body (server-owned members
// refused by name), and the handlers.

// environmentJSON is an environment as the API returns it: secrets redacted to {"set": true}.
type environmentJSON struct {
	ID            string          `json:"id"`
	CompanyID     string          `json:"company_id"`
	Name          string          `json:"name"`
	Driver        string          `json:"driver"`
	Status        string          `json:"status"`
	Config        map[string]any  `json:"config"`
	Qualification json.RawMessage `json:"qualification"`
	CreatedAt     time.Time       `json:"created_at"`
	UpdatedAt     time.Time       `json:"updated_at"`
}

// environmentOut is the API form of a row; the sealed secrets are never read for it.
func environmentOut(e db.Environment) (environmentJSON, error) {
	cfg, err := environment.Load(e.Driver, e.Config)
	if err != nil {
		return environmentJSON{}, err
	}
	return environmentJSON{ID: e.ID, CompanyID: e.CompanyID, Name: e.Name, Driver: e.Driver, Status: e.Status,
		Config: cfg.Redacted(), Qualification: e.Qualification, CreatedAt: e.CreatedAt.UTC(), UpdatedAt: e.UpdatedAt.UTC()}, nil
}

// environmentBody is the JSON body of POST and PATCH. Server-owned members are declared only so
// that their presence, even as null, is refused by name.
type environmentBody struct {
	Name   json.RawMessage `json:"name"`
	Driver json.RawMessage `json:"driver"`
	Config json.RawMessage `json:"config"`
	Status json.RawMessage `json:"status"`

	Qualification json.RawMessage `json:"qualification"`
	CompanyID     json.RawMessage `json:"company_id"`
	ID            json.RawMessage `json:"id"`
	Generation    json.RawMessage `json:"generation"`
	CreatedAt     json.RawMessage `json:"created_at"`
	UpdatedAt     json.RawMessage `json:"updated_at"`
}

// serverOwned names the first server-owned member present in the body, or "".
func (b environmentBody) serverOwned() string {
	for _, m := range []struct {
		name string
		raw  json.RawMessage
	}{{"qualification", b.Qualification}, {"company_id", b.CompanyID}, {"id", b.ID},
		{"generation", b.Generation}, {"created_at", b.CreatedAt}, {"updated_at", b.UpdatedAt}} {
		if m.raw != nil {
			return m.name
		}
	}
	return ""
}

// input turns the body into an input; a member of the wrong type is a field error.
func (b environmentBody) input() (environmentInput, error) {
	fields := map[string]string{}
	in := environmentInput{
		Name:   envJSONString(b.Name, "name", fields),
		Driver: envJSONString(b.Driver, "driver", fields),
		Status: envJSONString(b.Status, "status", fields),
	}
	if string(b.Config) == "null" {
		fields["config"] = "must be an object with the driver's settings"
	}
	in.Config = b.Config
	if len(fields) > 0 {
		return environmentInput{}, invalid(fields)
	}
	return in, nil
}

// envJSONString reads an optional string member: absent is nil, anything but a string is an error.
func envJSONString(raw json.RawMessage, field string, fields map[string]string) *string {
	if raw == nil {
		return nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		fields[field] = "must be a string"
		return nil
	}
	return &s
}

// decodeEnvironmentBody reads a POST or PATCH body, refusing server-owned members by name.
func decodeEnvironmentBody(w http.ResponseWriter, r *http.Request) (environmentBody, error) {
	var b environmentBody
	if err := decodeJSON(w, r, &b); err != nil {
		return b, err
	}
	if f := b.serverOwned(); f != "" {
		return b, errServerOwned(f, "")
	}
	return b, nil
}

// apiListEnvironments lists a company's environments by name, redacted: limit, cursor.
func (s *Server) apiListEnvironments(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	a, err := s.companyAccess(ctx, p, r.PathValue("cid"))
	if err != nil {
		return err
	}
	envs, next, err := s.listEnvironmentPage(ctx, r, a)
	if err != nil {
		return err
	}
	out := listResponse[environmentJSON]{Items: make([]environmentJSON, 0, len(envs)), NextCursor: next}
	for _, e := range envs {
		j, err := environmentOut(e)
		if err != nil {
			return err
		}
		out.Items = append(out.Items, j)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// listEnvironmentPage reads one page of a company's environments from the request's limit and
// cursor,
// and the cursor of the next page ("" on the last).
func (s *Server) listEnvironmentPage(ctx context.Context, r *http.Request, a access) ([]db.Environment, string, error) {
	limit, cursor, err := pageParams(r)
	if err != nil {
		return nil, "", err
	}
	var after db.EnvironmentCursor
	if err := decodeCursor(cursor, &after); err != nil {
		return nil, "", err
	}
	envs, err := db.ListEnvironments(ctx, s.pool, a.Company.ID, after, limit+1)
	if errors.Is(err, db.ErrInvalidID) {
		return nil, "", badRequest("bad_cursor", "The cursor is not valid; start again without it.")
	}
	if err != nil {
		return nil, "", err
	}
	if len(envs) <= limit {
		return envs, "", nil
	}
	envs = envs[:limit]
	last := envs[limit-1]
	return envs, encodeCursor(db.EnvironmentCursor{Name: last.Name, ID: last.ID}), nil
}

// apiCreateEnvironment creates an environment (instance admin): {name, driver, config} → 201.
func (s *Server) apiCreateEnvironment(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	a, err := s.companyAccess(ctx, p, r.PathValue("cid"))
	if err != nil {
		return err
	}
	// Refuse before reading the body, so a non-admin learns nothing from validation.
	if err := s.requireAdmin(r, a, "environment.create", "environment", ""); err != nil {
		return err
	}
	b, err := decodeEnvironmentBody(w, r)
	if err != nil {
		return err
	}
	if b.Status != nil {
		return errServerOwned("status", "")
	}
	in, err := b.input()
	if err != nil {
		return err
	}
	env, err := s.createEnvironment(ctx, r, a, in)
	if err != nil {
		return err
	}
	return writeEnvironment(w, http.StatusCreated, env)
}

// apiGetEnvironment returns one environment, redacted.
func (s *Server) apiGetEnvironment(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	id := r.PathValue("id")
	a, err := s.objectAccess(ctx, p, "environments", id)
	if err != nil {
		return err
	}
	env, err := db.EnvironmentByID(ctx, s.pool, a.Company.ID, id)
	if err != nil {
		return err
	}
	return writeEnvironment(w, http.StatusOK, env)
}

// apiPatchEnvironment changes an environment (instance admin): name, driver with config, config,
// status "archived"/"active" as an action → 200 with the object.
func (s *Server) apiPatchEnvironment(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	id := r.PathValue("id")
	a, err := s.adminObject(r, p, "environments", id, "environment.update", "environment")
	if err != nil {
		return err
	}
	b, err := decodeEnvironmentBody(w, r)
	if err != nil {
		return err
	}
	in, err := b.input()
	if err != nil {
		return err
	}
	env, err := s.updateEnvironment(ctx, r, a, id, in)
	if err != nil {
		return err
	}
	return writeEnvironment(w, http.StatusOK, env)
}

// writeEnvironment answers with the redacted environment object.
func writeEnvironment(w http.ResponseWriter, status int, env db.Environment) error {
	out, err := environmentOut(env)
	if err != nil {
		return err
	}
	writeJSON(w, status, out)
	return nil
}
