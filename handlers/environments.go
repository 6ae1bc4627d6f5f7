package handlers

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"berth/db"
	"berth/environment"
	"berth/workspace"
)

// emptyLayerDigest is the digest of version 1 of every sandbox's image: the empty layer, an empty
// directory tree as capsules digest it. The migration that brought image versions wrote the same
// value for the sandboxes made before it.
func emptyLayerDigest() string { return workspace.Manifest{}.Digest() }

// createFirstImage records the empty layer as a sandbox environment's next image version (1 for a
// new environment) and makes it the active one, in the transaction that makes it a sandbox.
func createFirstImage(ctx context.Context, q db.Querier, companyID, envID string) (db.ImageVersion, error) {
	return db.CreateImageVersion(ctx, q, db.NewImageVersion{CompanyID: companyID, EnvironmentID: envID,
		Digest: emptyLayerDigest(), Size: 0, Status: db.ImageActive})
}

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
	} else if msg := textProblem(name); msg != "" {
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
// event; a sandbox gets image version 1 (the empty layer), active, in the same transaction. Only
// instance admins may; anyone else gets a 403 and an audited denial.
func (s *Server) createEnvironment(ctx context.Context, r *http.Request, a access, in environmentInput) (db.Environment, error) {
	if err := s.requireAdmin(r, a, "environment.create", "environment", ""); err != nil {
		return db.Environment{}, err
	}
	fields := map[string]string{}
	name, driver := environmentNameOf(deref(in.Name), fields), deref(in.Driver)
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
		details := map[string]any{"driver": driver}
		if driver == environment.DriverSandbox {
			v, err := createFirstImage(ctx, tx, env.CompanyID, env.ID)
			if err != nil {
				return err
			}
			details["image_version"] = v.Number
		}
		return s.auditTx(ctx, tx, r, a, "environment.created", "environment", env.ID, details)
	})
	return env, err
}

// environmentPlan is a validated change of one environment: the row to write, the field names that
// changed (for the audit trail; never values) and whether the qualification is cleared.
type environmentPlan struct {
	row     db.EnvironmentChange
	changed []string
	status  string // the new status when it changes, else ""
	// firstImage: the environment becomes a sandbox without an active image, so the empty layer
	// is recorded as its next version (1 for a new sandbox) and activated with the change;
	// imageVersion is the number it got.
	firstImage   bool
	imageVersion int
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
		if plan.firstImage {
			v, err := createFirstImage(ctx, tx, a.Company.ID, id)
			if err != nil {
				return err
			}
			plan.imageVersion = v.Number
		}
		return s.auditEnvironmentChange(ctx, tx, r, a, id, plan)
	})
	if err == nil && s.envChanged != nil {
		s.envChanged(id) // its egress policy applies to the next connection
	}
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
	oldImage, err := db.ActiveImageDigest(ctx, q, old.CompanyID, old.ID)
	if err != nil {
		return environmentPlan{}, err
	}
	image := oldImage
	if p.row.Driver == environment.DriverSandbox && oldImage == "" {
		p.firstImage, image = true, emptyLayerDigest()
	}
	return s.finishPlan(p, old, oldCfg, oldSec, oldImage, cfg, saltedSecrets(sec), image)
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
// qualification is cleared (the fingerprints of old and new, each with its active image, differ).
func (s *Server) finishPlan(p environmentPlan, old db.Environment, oldCfg environment.Config, oldSec environment.Secrets,
	oldImage string, cfg environment.Config, sec environment.Secrets, image string) (environmentPlan, error) {
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
	p.row.ClearQualification = environment.Fingerprint(oldCfg, oldSec, oldImage) != environment.Fingerprint(cfg, sec, image)
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
		if p.imageVersion > 0 {
			details["image_version"] = p.imageVersion
		}
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
