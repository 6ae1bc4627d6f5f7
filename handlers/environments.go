package handlers

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"berth/db"
	"berth/environment"
	"berth/views"
)

// envNoActiveImage is the active image every environment has until image versions exist; it enters
// the fingerprint so that activating an image will clear the qualification on the same path.
const envNoActiveImage = ""

// environmentInput is a requested create or change, from the API or a form; nil members were not
// given. Config is the driver's settings as JSON, replaced as a whole when given.
type environmentInput struct {
	Name   *string
	Driver *string
	Config json.RawMessage
	Status *string
}

// newEnvironmentID picks the id of a new environment before it is inserted, because its secrets
// are sealed to it.
func newEnvironmentID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand never fails (Go 1.24+: it aborts the program instead)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// sealSecrets seals an environment's secret values bound to its id (nil when there are none),
// giving them a fingerprint salt on first use.
func (s *Server) sealSecrets(id string, sec environment.Secrets) ([]byte, error) {
	if sec.Empty() {
		return nil, nil
	}
	b, err := json.Marshal(sec)
	if err != nil {
		return nil, fmt.Errorf("seal environment secrets: %w", err)
	}
	return s.secrets.Seal(b, environment.SecretsAAD(id))
}

// openSecrets opens an environment's sealed secrets. Secrets that no longer open (another key)
// count as none: the row keeps them until an admin enters new values, and keeping a value that
// cannot be read is refused field by field.
func (s *Server) openSecrets(ctx context.Context, e db.Environment) environment.Secrets {
	var sec environment.Secrets
	if len(e.Secrets) == 0 {
		return sec
	}
	b, err := s.secrets.Open(e.Secrets, environment.SecretsAAD(e.ID))
	if err != nil || json.Unmarshal(b, &sec) != nil {
		// The error is not logged: a decoding error could quote the plaintext.
		s.log.WarnContext(ctx, "environment secrets do not open with this key; an admin must enter them again",
			"environment_id", e.ID)
		return environment.Secrets{}
	}
	return sec
}

// saltedSecrets gives secrets a fingerprint salt when they have values and none yet.
func saltedSecrets(sec environment.Secrets) environment.Secrets {
	if !sec.Empty() && sec.Salt == "" {
		sec.Salt = rand.Text()
	}
	return sec
}

// envConfigFields prefixes the config parser's field keys for the API ("config", "config.host").
func envConfigFields(errs environment.FieldErrors, fields map[string]string) {
	for k, msg := range errs {
		if k == "" {
			fields["config"] = msg
		} else {
			fields["config."+k] = msg
		}
	}
}

// environmentNameOf trims a name and says what is wrong with it.
func environmentNameOf(raw string, fields map[string]string) string {
	name := strings.TrimSpace(raw)
	if msg := environment.ValidName(name); msg != "" {
		fields["name"] = msg
	}
	return name
}

// checkEnvironmentDriver says what is wrong with a driver.
func checkEnvironmentDriver(driver string, fields map[string]string) {
	if !environment.ValidDriver(driver) {
		fields["driver"] = "choose local, ssh or sandbox"
	}
}

// errEnvironmentNameTaken is the 409 for a name already used in the company (on the name field, for forms).
func errEnvironmentNameTaken(name string) error {
	return &httpError{Status: http.StatusConflict, Code: "name_taken",
		Message: fmt.Sprintf("An environment named %q already exists in this company.", name),
		Fields:  map[string]string{"name": "already used by another environment of this company"}}
}

// createEnvironment validates a new environment, seals its secrets and inserts it with its audit
// event. Only instance admins may; anyone else gets a 403 and an audited denial.
func (s *Server) createEnvironment(ctx context.Context, r *http.Request, a access, in environmentInput) (db.Environment, error) {
	if err := s.requireAdmin(r, a, "environment.create", "environment", ""); err != nil {
		return db.Environment{}, err
	}
	fields := map[string]string{}
	name, driver := environmentNameOf(envDeref(in.Name), fields), envDeref(in.Driver)
	checkEnvironmentDriver(driver, fields)
	var (
		cfg environment.Config
		sec environment.Secrets
	)
	if _, bad := fields["driver"]; !bad {
		var errs environment.FieldErrors
		cfg, sec, errs = environment.Parse(driver, in.Config, nil)
		envConfigFields(errs, fields)
	}
	if len(fields) > 0 {
		return db.Environment{}, invalid(fields)
	}
	id := newEnvironmentID()
	sealed, err := s.sealSecrets(id, saltedSecrets(sec))
	if err != nil {
		return db.Environment{}, err
	}
	doc, err := cfg.Document()
	if err != nil {
		return db.Environment{}, err
	}
	var env db.Environment
	err = db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		env, err = db.CreateEnvironment(ctx, tx, db.NewEnvironment{ID: id, CompanyID: a.Company.ID,
			Name: name, Driver: driver, Config: doc, Secrets: sealed})
		if errors.Is(err, db.ErrConflict) {
			return errEnvironmentNameTaken(name)
		}
		if err != nil {
			return err
		}
		return s.auditTx(ctx, tx, r, a, "environment.created", "environment", env.ID, map[string]any{"driver": driver})
	})
	return env, err
}

// environmentPlan is a validated change of one environment: the row to write, the field names that
// changed (for the audit trail; never values) and whether the qualification is cleared.
type environmentPlan struct {
	row     db.EnvironmentChange
	changed []string
	status  string // the new status when it changes, else ""
}

// updateEnvironment applies a change (rename, new driver or config, archive or restore) to a
// locked row. A change of driver, config, secrets or active image clears the qualification in the
// same UPDATE; a rename does not. Archiving is refused while a lease holds the environment.
func (s *Server) updateEnvironment(ctx context.Context, r *http.Request, a access, id string, in environmentInput) (db.Environment, error) {
	if err := s.requireAdmin(r, a, environmentAction(in), "environment", id); err != nil {
		return db.Environment{}, err
	}
	var env db.Environment
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		old, err := db.LockEnvironment(ctx, tx, a.Company.ID, id)
		if err != nil {
			return err
		}
		plan, err := s.planEnvironmentChange(ctx, tx, old, in)
		if err != nil {
			return err
		}
		if len(plan.changed) == 0 && plan.status == "" {
			env = old
			return nil
		}
		if env, err = db.UpdateEnvironment(ctx, tx, a.Company.ID, id, plan.row); err != nil {
			return err
		}
		return s.auditEnvironmentChange(ctx, tx, r, a, id, plan)
	})
	return env, err
}

// environmentAction names what a change attempts, for the audit trail of a denial.
func environmentAction(in environmentInput) string {
	if in.Name == nil && in.Driver == nil && in.Config == nil && in.Status != nil {
		switch *in.Status {
		case db.EnvironmentArchived:
			return "environment.archive"
		case db.EnvironmentActive:
			return "environment.unarchive"
		}
	}
	return "environment.update"
}

// planEnvironmentChange validates a change against the locked row and works out what to write.
func (s *Server) planEnvironmentChange(ctx context.Context, q db.Querier, old db.Environment, in environmentInput) (environmentPlan, error) {
	oldCfg, err := environment.Load(old.Driver, old.Config)
	if err != nil {
		return environmentPlan{}, err
	}
	oldSec := s.openSecrets(ctx, old)
	fields := map[string]string{}
	p := environmentPlan{row: db.EnvironmentChange{Name: old.Name, Driver: old.Driver, Status: old.Status,
		Config: old.Config, Secrets: old.Secrets}}
	if in.Name != nil {
		p.row.Name = environmentNameOf(*in.Name, fields)
	}
	if in.Driver != nil {
		p.row.Driver = *in.Driver
		checkEnvironmentDriver(p.row.Driver, fields)
	}
	if in.Status != nil {
		p.row.Status = *in.Status
		if p.row.Status != db.EnvironmentActive && p.row.Status != db.EnvironmentArchived {
			fields["status"] = `must be "active" or "archived"`
		}
	}
	cfg, sec := oldCfg, oldSec
	_, badDriver := fields["driver"]
	switch {
	case in.Config != nil && !badDriver:
		var errs environment.FieldErrors
		cfg, sec, errs = environment.Parse(p.row.Driver, in.Config, &oldSec)
		envConfigFields(errs, fields)
	case in.Config == nil && p.row.Driver != old.Driver && !badDriver:
		fields["config"] = "required when the driver changes: send the whole config for the new driver"
	}
	if len(fields) > 0 {
		return environmentPlan{}, invalid(fields)
	}
	if err := checkEnvironmentRules(ctx, q, old, p.row); err != nil {
		return environmentPlan{}, err
	}
	return s.finishPlan(p, old, oldCfg, oldSec, cfg, saltedSecrets(sec))
}

// checkEnvironmentRules refuses a rename onto a taken name and archiving under a live lease.
func checkEnvironmentRules(ctx context.Context, q db.Querier, old db.Environment, next db.EnvironmentChange) error {
	if next.Name != old.Name {
		taken, err := db.EnvironmentNameTaken(ctx, q, old.CompanyID, next.Name, old.ID)
		if err != nil {
			return err
		}
		if taken {
			return errEnvironmentNameTaken(next.Name)
		}
	}
	if next.Status == db.EnvironmentArchived && old.Status != db.EnvironmentArchived {
		n, err := db.LiveEnvironmentLeases(ctx, q, old.CompanyID, old.ID)
		if err != nil {
			return err
		}
		if n > 0 {
			return errEnvironmentLeaseActive(n)
		}
	}
	return nil
}

// errEnvironmentLeaseActive is the 409 for archiving an environment that a lease still holds.
func errEnvironmentLeaseActive(n int) error {
	leases := "1 lease holds"
	if n != 1 {
		leases = strconv.Itoa(n) + " leases hold"
	}
	return &httpError{Status: http.StatusConflict, Code: "lease_active",
		Message: fmt.Sprintf("Cannot archive: %s this environment (acquiring, active or releasing). Wait for the runs to finish or release the leases first.", leases),
		Extra:   map[string]any{"live_leases": n}}
}

// finishPlan fills in the new config and secrets, the changed field names and whether the
// qualification is cleared (the fingerprints of old and new differ).
func (s *Server) finishPlan(p environmentPlan, old db.Environment, oldCfg environment.Config, oldSec environment.Secrets,
	cfg environment.Config, sec environment.Secrets) (environmentPlan, error) {
	if p.row.Name != old.Name {
		p.changed = append(p.changed, "name")
	}
	if p.row.Driver != old.Driver {
		p.changed = append(p.changed, "driver")
	}
	for _, k := range environment.ChangedKeys(oldCfg, oldSec, cfg, sec) {
		p.changed = append(p.changed, "config."+k)
	}
	if p.row.Status != old.Status {
		p.status = p.row.Status
	}
	p.row.ClearQualification = environment.Fingerprint(oldCfg, oldSec, envNoActiveImage) != environment.Fingerprint(cfg, sec, envNoActiveImage)
	doc, err := cfg.Document()
	if err != nil {
		return environmentPlan{}, err
	}
	p.row.Config = doc
	if !sec.Equal(oldSec) {
		if p.row.Secrets, err = s.sealSecrets(old.ID, sec); err != nil {
			return environmentPlan{}, err
		}
	}
	return p, nil
}

// auditEnvironmentChange records an update (changed field names only) and an archive or restore.
func (s *Server) auditEnvironmentChange(ctx context.Context, q db.Querier, r *http.Request, a access, id string, p environmentPlan) error {
	if len(p.changed) > 0 {
		details := map[string]any{"changed": p.changed, "qualification_cleared": p.row.ClearQualification}
		if err := s.auditTx(ctx, q, r, a, "environment.updated", "environment", id, details); err != nil {
			return err
		}
	}
	switch p.status {
	case db.EnvironmentArchived:
		return s.auditTx(ctx, q, r, a, "environment.archived", "environment", id, nil)
	case db.EnvironmentActive:
		return s.auditTx(ctx, q, r, a, "environment.unarchived", "environment", id, nil)
	}
	return nil
}

// envDeref is the string p points to, or "" for nil.
func envDeref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// ---- JSON API ----

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

// errEnvironmentServerOwned refuses a body that sets a field only the server writes.
func errEnvironmentServerOwned(field string) error {
	return &httpError{Status: http.StatusBadRequest, Code: "server_owned_field",
		Message: fmt.Sprintf("%s is written by the server only; remove it from the request.", field),
		Extra:   map[string]any{"field": field}}
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
		return b, errEnvironmentServerOwned(f)
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

// listEnvironmentPage reads one page of a company's environments from the request's limit and cursor,
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
		return errEnvironmentServerOwned("status")
	}
	in, err := b.input()
	if err != nil {
		return err
	}
	env, err := s.createEnvironment(ctx, r, a, in)
	if err != nil {
		return err
	}
	out, err := environmentOut(env)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
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
	out, err := environmentOut(env)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
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
	out, err := environmentOut(env)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// ---- Pages and forms ----

// environmentsPage lists a company's environments, with the creation form for instance admins
// (?driver= picks the form's driver).
func (s *Server) environmentsPage(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	a, err := s.companyAccess(ctx, p, r.PathValue("cid"))
	if err != nil {
		return err
	}
	form := newEnvironmentForm(a.Company.ID, r.URL.Query().Get("driver"))
	return s.renderEnvironments(w, r, a, http.StatusOK, form)
}

// renderEnvironments renders the list page with the given creation form.
func (s *Server) renderEnvironments(w http.ResponseWriter, r *http.Request, a access, status int, form views.EnvironmentForm) error {
	envs, next, err := s.listEnvironmentPage(r.Context(), r, a)
	if err != nil {
		return err
	}
	d := views.EnvironmentsData{CompanyID: a.Company.ID, IsAdmin: a.Admin, New: form}
	for _, e := range envs {
		d.Rows = append(d.Rows, views.EnvironmentRow{ID: e.ID, Name: e.Name, Driver: e.Driver, Status: e.Status,
			Qualification: envQualificationView(e.Qualification)})
	}
	if next != "" {
		q := url.Values{"cursor": {next}}
		if limit := r.URL.Query().Get("limit"); limit != "" {
			q.Set("limit", limit)
		}
		d.NextURL = "/companies/" + a.Company.ID + "/environments?" + q.Encode()
	}
	w.Header().Set("Vary", "HX-Request")
	return s.renderStatus(w, r, status, views.EnvironmentsPage(s.companyFrame(r, a, "Environments", "environments"), d))
}

// environmentPage shows one environment (?driver= picks the edit form's driver).
func (s *Server) environmentPage(w http.ResponseWriter, r *http.Request, p *principal) error {
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
	d, err := environmentView(a, env, r.URL.Query().Get("driver"))
	if err != nil {
		return err
	}
	return s.renderEnvironment(w, r, a, http.StatusOK, d)
}

// environmentView is what an environment's page shows, redacted, with the edit form for driver
// ("" for the stored one).
func environmentView(a access, env db.Environment, driver string) (views.EnvironmentDetail, error) {
	cfg, err := environment.Load(env.Driver, env.Config)
	if err != nil {
		return views.EnvironmentDetail{}, err
	}
	d := views.EnvironmentDetail{ID: env.ID, CompanyID: env.CompanyID, Name: env.Name, Driver: env.Driver,
		Status: env.Status, CreatedAt: env.CreatedAt, UpdatedAt: env.UpdatedAt, Settings: environmentSettingsView(cfg),
		Qualification: envQualificationView(env.Qualification), IsAdmin: a.Admin, Edit: editEnvironmentForm(env, cfg, driver)}
	for _, v := range cfg.Env {
		d.Env = append(d.Env, views.EnvironmentVar{Name: v.Name, Value: v.Value, Secret: v.Secret})
	}
	return d, nil
}

// renderEnvironment renders an environment's page with status.
func (s *Server) renderEnvironment(w http.ResponseWriter, r *http.Request, a access, status int, d views.EnvironmentDetail) error {
	w.Header().Set("Vary", "HX-Request")
	return s.renderStatus(w, r, status, views.EnvironmentPage(s.companyFrame(r, a, d.Name, "environments"), d))
}

// environmentSettingsView phrases a configuration for the page; the private key only as "set".
func environmentSettingsView(c environment.Config) []views.EnvironmentSetting {
	switch c.Driver {
	case environment.DriverSSH:
		return []views.EnvironmentSetting{
			{Label: "Host", Value: c.SSH.Host, Mono: true},
			{Label: "Port", Value: strconv.Itoa(c.SSH.Port), Mono: true},
			{Label: "User", Value: c.SSH.User, Mono: true},
			{Label: "Private key", Secret: true, Hint: "Encrypted at rest; never shown."},
			{Label: "Host key", Value: c.SSH.HostKey, Mono: true, Hint: environment.HostKeyFingerprint(c.SSH.HostKey)},
		}
	case environment.DriverSandbox:
		sb := c.Sandbox
		return []views.EnvironmentSetting{
			{Label: "Network in runs", Value: envOnOff(sb.Network)},
			{Label: "Network in setup sessions", Value: envOnOff(sb.SetupNetwork)},
			{Label: "Memory", Value: strconv.Itoa(sb.MemoryMB) + " MiB"},
			{Label: "CPUs", Value: strconv.FormatFloat(sb.CPUs, 'f', -1, 64)},
			{Label: "Processes at most", Value: strconv.Itoa(sb.PidsMax)},
			{Label: "Time limit", Value: strconv.Itoa(sb.TimeoutS) + " s"},
			{Label: "Active image", Value: "none yet", Hint: "Image versions arrive with later work; the active image will show here."},
		}
	default:
		return []views.EnvironmentSetting{{Label: "Runs on", Value: "this machine, as the user Berth runs as"}}
	}
}

func envOnOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// envQualificationDoc is the qualification object a probe writes.
type envQualificationDoc struct {
	ProbedAt          time.Time `json:"probed_at"`
	OK                bool      `json:"ok"`
	Summary           string    `json:"summary"`
	ConfigFingerprint string    `json:"config_fingerprint"`
	ImageDigest       string    `json:"image_digest"`
}

// envQualificationView phrases a stored qualification; an unreadable one counts as failed.
func envQualificationView(raw []byte) views.EnvironmentQualification {
	if len(raw) == 0 || string(raw) == "null" {
		return views.EnvironmentQualification{State: "none"}
	}
	var q envQualificationDoc
	if err := json.Unmarshal(raw, &q); err != nil {
		return views.EnvironmentQualification{State: "failed", Summary: "The stored qualification cannot be read."}
	}
	state := "failed"
	if q.OK {
		state = "ok"
	}
	return views.EnvironmentQualification{State: state, ProbedAt: q.ProbedAt, Summary: q.Summary,
		Fingerprint: q.ConfigFingerprint, ImageDigest: q.ImageDigest}
}

// newEnvironmentForm is the empty creation form for a driver (local unless another is asked for).
func newEnvironmentForm(companyID, driver string) views.EnvironmentForm {
	f := views.EnvironmentForm{ID: "new-environment", Action: "/companies/" + companyID + "/environments",
		FieldsURL: "/companies/" + companyID + "/environments"}
	setEnvironmentFormDriver(&f, driver)
	return f
}

// setEnvironmentFormDriver switches a form to a driver and fills that driver's defaults.
func setEnvironmentFormDriver(f *views.EnvironmentForm, driver string) {
	if !environment.ValidDriver(driver) {
		driver = environment.DriverLocal
	}
	f.Driver = driver
	f.Host, f.Port, f.User, f.HostKey, f.KeySet = "", "", "", "", false
	f.Network, f.SetupNet = false, true
	f.MemoryMB, f.CPUs, f.PidsMax, f.TimeoutS = "", "", "", ""
}

// editEnvironmentForm is the edit form filled from the stored config; for another driver
// (?driver=) the driver's defaults, with the variables kept. Secret values are never filled in.
func editEnvironmentForm(env db.Environment, cfg environment.Config, driver string) views.EnvironmentForm {
	f := views.EnvironmentForm{ID: "edit-environment", Action: "/environments/" + env.ID,
		FieldsURL: "/environments/" + env.ID, Edit: true, Name: env.Name}
	if driver == "" {
		driver = env.Driver
	}
	setEnvironmentFormDriver(&f, driver)
	var plain, secret []string
	for _, v := range cfg.Env {
		if v.Secret {
			secret = append(secret, v.Name)
		} else {
			plain = append(plain, v.Name+"="+v.Value)
		}
	}
	f.Env, f.SecretEnv = strings.Join(plain, "\n"), strings.Join(secret, "\n")
	if f.Driver != env.Driver {
		return f
	}
	switch cfg.Driver {
	case environment.DriverSSH:
		f.Host, f.Port, f.User, f.HostKey, f.KeySet = cfg.SSH.Host, strconv.Itoa(cfg.SSH.Port), cfg.SSH.User, cfg.SSH.HostKey, true
	case environment.DriverSandbox:
		sb := cfg.Sandbox
		f.Network, f.SetupNet = sb.Network, sb.SetupNetwork
		f.MemoryMB, f.CPUs = strconv.Itoa(sb.MemoryMB), strconv.FormatFloat(sb.CPUs, 'f', -1, 64)
		f.PidsMax, f.TimeoutS = strconv.Itoa(sb.PidsMax), strconv.Itoa(sb.TimeoutS)
	}
	return f
}

// environmentFormValues is a submitted create or edit form.
type environmentFormValues struct {
	Name, Driver            string
	Host, Port, User        string
	PrivateKey, HostKey     string
	SandboxFields           bool
	Network, SetupNet       bool
	MemoryMB, CPUs, PidsMax string
	TimeoutS                string
	Env, SecretEnv          string
	plainCount              int // env entries that came from the Env field, for mapping errors back
}

// readEnvironmentForm reads a submitted form (at most 1 MiB); a server-owned field is a 400.
func readEnvironmentForm(w http.ResponseWriter, r *http.Request) (environmentFormValues, error) {
	r.Body = http.MaxBytesReader(w, r.Body, maxJSONBody)
	if err := r.ParseForm(); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return environmentFormValues{}, &httpError{Status: http.StatusRequestEntityTooLarge, Code: "body_too_large", Message: "The form is larger than 1 MiB."}
		}
		return environmentFormValues{}, badRequest("bad_form", "The form could not be read.")
	}
	for _, f := range []string{"qualification", "company_id", "id", "generation", "status"} {
		if r.PostForm.Has(f) {
			return environmentFormValues{}, errEnvironmentServerOwned(f)
		}
	}
	v := r.PostForm.Get
	return environmentFormValues{
		Name: v("name"), Driver: v("driver"),
		Host: v("host"), Port: v("port"), User: v("user"), PrivateKey: v("private_key"), HostKey: v("host_key"),
		SandboxFields: v("sandbox_fields") != "", Network: v("network") != "", SetupNet: v("setup_network") != "",
		MemoryMB: v("memory_mb"), CPUs: v("cpus"), PidsMax: v("pids_max"), TimeoutS: v("timeout_s"),
		Env: v("env"), SecretEnv: v("secret_env"),
	}, nil
}

// envJSONNumber matches a JSON number literal, so a typed number passes as a number and anything
// else stays a string for the config parser to refuse.
var envJSONNumber = regexp.MustCompile(`^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$`)

// envFormNumber puts a numeric field into a config: omitted when empty (the default applies).
func envFormNumber(cfg map[string]any, key, value string) {
	value = strings.TrimSpace(value)
	switch {
	case value == "":
	case envJSONNumber.MatchString(value):
		cfg[key] = json.Number(value)
	default:
		cfg[key] = value
	}
}

// input turns the form into the same input the API builds; lines that are not NAME=value are
// field errors.
func (f *environmentFormValues) input() (environmentInput, map[string]string) {
	fields := map[string]string{}
	cfg := map[string]any{}
	switch f.Driver {
	case environment.DriverSSH:
		cfg["host"], cfg["user"], cfg["host_key"] = f.Host, f.User, f.HostKey
		envFormNumber(cfg, "port", f.Port)
		if strings.TrimSpace(f.PrivateKey) != "" {
			cfg["private_key"] = f.PrivateKey
		}
	case environment.DriverSandbox:
		if f.SandboxFields {
			cfg["network"], cfg["setup_network"] = f.Network, f.SetupNet
		}
		envFormNumber(cfg, "memory_mb", f.MemoryMB)
		envFormNumber(cfg, "cpus", f.CPUs)
		envFormNumber(cfg, "pids_max", f.PidsMax)
		envFormNumber(cfg, "timeout_s", f.TimeoutS)
	}
	plain, errPlain := envFormLines(f.Env, false)
	secret, errSecret := envFormLines(f.SecretEnv, true)
	if errPlain != "" {
		fields["env"] = errPlain
	}
	if errSecret != "" {
		fields["secret_env"] = errSecret
	}
	f.plainCount = len(plain)
	cfg["env"] = append(plain, secret...)
	raw, err := json.Marshal(cfg)
	if err != nil {
		fields["config"] = "the settings could not be read"
	}
	name, driver := f.Name, f.Driver
	return environmentInput{Name: &name, Driver: &driver, Config: raw}, fields
}

// envFormLines reads NAME=value lines into env entries. In the secret field a line with only NAME
// keeps the stored value.
func envFormLines(text string, secret bool) ([]map[string]any, string) {
	entries := []map[string]any{}
	for i, line := range strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		name, value, hasValue := strings.Cut(line, "=")
		name = strings.TrimSpace(name)
		switch {
		case hasValue:
			entries = append(entries, map[string]any{"name": name, "value": value, "secret": secret})
		case secret:
			entries = append(entries, map[string]any{"name": name, "value": map[string]bool{"set": true}, "secret": true})
		default:
			return nil, fmt.Sprintf("line %d: write NAME=value", i+1)
		}
	}
	return entries, ""
}

// formFields maps the API's field keys onto the form's fields.
func (f environmentFormValues) formFields(apiFields map[string]string) map[string]string {
	out := map[string]string{}
	add := func(k, msg string) {
		if prev, ok := out[k]; ok {
			msg = prev + "; " + msg
		}
		out[k] = msg
	}
	for _, k := range slices.Sorted(maps.Keys(apiFields)) {
		msg := apiFields[k]
		key, isConfig := strings.CutPrefix(k, "config.")
		switch {
		case !isConfig:
			add(k, msg)
		case strings.HasPrefix(key, "env["):
			idx, _ := strconv.Atoi(strings.TrimPrefix(key[:strings.IndexByte(key, ']')], "env["))
			if idx < f.plainCount {
				add("env", msg)
			} else {
				add("secret_env", msg)
			}
		default:
			add(key, msg)
		}
	}
	return out
}

// refill is the form shown again after a refusal: what was typed, except secret values (the
// private key is never sent back; secret lines keep their names only).
func (f environmentFormValues) refill(form views.EnvironmentForm, errs map[string]string) views.EnvironmentForm {
	keySet := form.KeySet && f.Driver == form.Driver
	form.Name = f.Name
	setEnvironmentFormDriver(&form, f.Driver)
	form.Host, form.Port, form.User, form.HostKey, form.KeySet = f.Host, f.Port, f.User, f.HostKey, keySet
	if f.SandboxFields {
		form.Network, form.SetupNet = f.Network, f.SetupNet
	}
	form.MemoryMB, form.CPUs, form.PidsMax, form.TimeoutS = f.MemoryMB, f.CPUs, f.PidsMax, f.TimeoutS
	form.Env = f.Env
	var names []string
	typedValues := false
	for _, line := range strings.Split(strings.ReplaceAll(f.SecretEnv, "\r\n", "\n"), "\n") {
		name, _, hasValue := strings.Cut(line, "=")
		if name = strings.TrimSpace(name); name != "" {
			names, typedValues = append(names, name), typedValues || hasValue
		}
	}
	form.SecretEnv = strings.Join(names, "\n")
	form.Errors = errs
	if _, hasSecretErr := errs["secret_env"]; typedValues && !hasSecretErr {
		form.Errors["secret_env"] = "Secret values are not shown again: enter NAME=value again for the ones you typed."
	}
	return form
}

// envFormRefusal reports the field messages and status of a refusal a form shows inline.
func envFormRefusal(err error) (map[string]string, int, bool) {
	var he *httpError
	if errors.As(err, &he) && len(he.Fields) > 0 {
		return he.Fields, he.Status, true
	}
	return nil, 0, false
}

// envFormStatus is the status of a form shown again after a refusal. htmx 2 does not swap 4xx
// answers, so htmx gets 200 and swaps in the messages; a plain browser gets the real status.
func envFormStatus(r *http.Request, status int) int {
	if isHTMX(r) {
		return http.StatusOK
	}
	return status
}

// createEnvironmentForm creates an environment from the list page's form: 303 to its page
// (htmx: HX-Redirect); refusals show the form again with the messages.
func (s *Server) createEnvironmentForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	a, err := s.companyAccess(ctx, p, r.PathValue("cid"))
	if err != nil {
		return err
	}
	if err := s.requireAdmin(r, a, "environment.create", "environment", ""); err != nil {
		return err
	}
	f, err := readEnvironmentForm(w, r)
	if err != nil {
		return err
	}
	form := newEnvironmentForm(a.Company.ID, f.Driver)
	in, fields := f.input()
	if len(fields) > 0 {
		return s.renderEnvironments(w, r, a, envFormStatus(r, http.StatusUnprocessableEntity), f.refill(form, fields))
	}
	env, err := s.createEnvironment(ctx, r, a, in)
	if apiFields, status, ok := envFormRefusal(err); ok {
		return s.renderEnvironments(w, r, a, envFormStatus(r, status), f.refill(form, f.formFields(apiFields)))
	}
	if err != nil {
		return err
	}
	envSeeOther(w, r, "/environments/"+env.ID)
	return nil
}

// updateEnvironmentForm saves the edit form: an empty private key and secret lines with a name
// only keep the stored values. Success shows the page again (htmx swaps it in; a plain browser
// is redirected to it).
func (s *Server) updateEnvironmentForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	id := r.PathValue("id")
	a, err := s.adminObject(r, p, "environments", id, "environment.update", "environment")
	if err != nil {
		return err
	}
	f, err := readEnvironmentForm(w, r)
	if err != nil {
		return err
	}
	in, fields := f.input()
	status := http.StatusUnprocessableEntity
	if len(fields) == 0 {
		_, err = s.updateEnvironment(ctx, r, a, id, in)
		apiFields, refusedWith, refused := envFormRefusal(err)
		if !refused {
			return s.afterEnvironmentAction(w, r, a, id, err)
		}
		fields, status = f.formFields(apiFields), refusedWith
	}
	env, err := db.EnvironmentByID(ctx, s.pool, a.Company.ID, id)
	if err != nil {
		return err
	}
	d, err := environmentView(a, env, f.Driver)
	if err != nil {
		return err
	}
	d.Edit = f.refill(d.Edit, fields)
	return s.renderEnvironment(w, r, a, envFormStatus(r, status), d)
}

// archiveEnvironmentForm archives an environment from its page; a live lease shows the reason.
func (s *Server) archiveEnvironmentForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	return s.environmentStatusForm(w, r, p, db.EnvironmentArchived)
}

// unarchiveEnvironmentForm restores an archived environment from its page.
func (s *Server) unarchiveEnvironmentForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	return s.environmentStatusForm(w, r, p, db.EnvironmentActive)
}

// environmentStatusForm sets an environment's status from a page form.
func (s *Server) environmentStatusForm(w http.ResponseWriter, r *http.Request, p *principal, status string) error {
	ctx := r.Context()
	id := r.PathValue("id")
	a, err := s.objectAccess(ctx, p, "environments", id)
	if err != nil {
		return err
	}
	_, err = s.updateEnvironment(ctx, r, a, id, environmentInput{Status: &status})
	return s.afterEnvironmentAction(w, r, a, id, err)
}

// afterEnvironmentAction answers a page form that changed an environment. Success: htmx gets the
// fresh page to swap in, a plain browser a 303 to it. A conflict (a live lease) shows the page
// with the reason; other errors go to the adapter.
func (s *Server) afterEnvironmentAction(w http.ResponseWriter, r *http.Request, a access, id string, err error) error {
	var he *httpError
	conflict := errors.As(err, &he) && he.Status == http.StatusConflict
	if err != nil && !conflict {
		return err
	}
	if err == nil && !isHTMX(r) {
		envSeeOther(w, r, "/environments/"+id)
		return nil
	}
	env, loadErr := db.EnvironmentByID(r.Context(), s.pool, a.Company.ID, id)
	if loadErr != nil {
		return loadErr
	}
	d, loadErr := environmentView(a, env, "")
	if loadErr != nil {
		return loadErr
	}
	status := http.StatusOK
	if conflict {
		status, d.Alert = envFormStatus(r, he.Status), he.Message
	}
	return s.renderEnvironment(w, r, a, status, d)
}

// envSeeOther sends the browser to url after a successful form: a 303, or HX-Redirect for htmx.
func envSeeOther(w http.ResponseWriter, r *http.Request, url string) {
	if isHTMX(r) {
		w.Header().Set("HX-Redirect", url)
		w.WriteHeader(http.StatusNoContent)
		return
	}
	http.Redirect(w, r, url, http.StatusSeeOther)
}
