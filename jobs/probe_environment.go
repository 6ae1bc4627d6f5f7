package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"berth/db"
	"berth/environment"
)

// probeTimeout bounds one probe: the driver's checks each have their own shorter limits.
const probeTimeout = 2 * time.Minute

// probeAttempts is how often an interrupted probe (a shutdown, a lost database) is tried; a probe
// that ran records its result, failed or not, and is not retried.
const probeAttempts = 3

// ProbeEnvironmentArgs asks to qualify an environment: an instance admin requested a probe.
type ProbeEnvironmentArgs struct {
	CompanyID     string `json:"company_id"`
	EnvironmentID string `json:"environment_id"`
}

// Kind names the job in River.
func (ProbeEnvironmentArgs) Kind() string { return "probe_environment" }

// InsertOpts retries only interrupted probes, a few times.
func (ProbeEnvironmentArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{MaxAttempts: probeAttempts}
}

// Qualification is the document a probe writes into environments.qualification (server-written
// only; docs/api.md, "Environments"). It holds for ConfigFingerprint alone: any change of driver, settings,
// secrets or active image gives another fingerprint and clears it.
type Qualification struct {
	OK                bool                `json:"ok"`
	ProbedAt          time.Time           `json:"probed_at"`
	Summary           string              `json:"summary"`
	Checks            []environment.Check `json:"checks"`
	ConfigFingerprint string              `json:"config_fingerprint"`
	ImageDigest       string              `json:"image_digest"`
	// Fingerprint is an ssh environment's pinned host key as "SHA256:…"; absent for other drivers.
	Fingerprint string `json:"fingerprint,omitempty"`
}

// ProbeEnvironmentWorker builds the environment's driver the way runs do, probes it and records
// the result as its qualification. A probe earned for a configuration that changed while it ran
// (another fingerprint when it finishes) writes nothing: the qualification was cleared by that
// change and stays cleared. Probing again only replaces the result, so a retry is harmless.
type ProbeEnvironmentWorker struct {
	river.WorkerDefaults[ProbeEnvironmentArgs]
	runWorker
	// beforeWrite, when set (tests), runs between the probe and the write.
	beforeWrite func(ctx context.Context)
}

// Timeout bounds one probe.
func (w *ProbeEnvironmentWorker) Timeout(*river.Job[ProbeEnvironmentArgs]) time.Duration {
	return probeTimeout
}

// Work probes the environment and writes its qualification.
func (w *ProbeEnvironmentWorker) Work(ctx context.Context, job *river.Job[ProbeEnvironmentArgs]) error {
	a := job.Args
	env, err := db.EnvironmentByID(ctx, w.deps.Pool, a.CompanyID, a.EnvironmentID)
	if errors.Is(err, db.ErrNotFound) {
		return river.JobCancel(fmt.Errorf("probe_environment: environment %s is gone", a.EnvironmentID))
	}
	if err != nil {
		return err
	}
	basis, err := w.qualificationBasis(ctx, w.deps.Pool, env)
	if err != nil {
		return river.JobCancel(fmt.Errorf("probe_environment: %w", err))
	}
	res, err := w.probe(ctx, db.Run{CompanyID: env.CompanyID, EnvironmentID: env.ID})
	if err != nil {
		return err // interrupted: River tries again
	}
	q := Qualification{OK: res.OK, ProbedAt: time.Now().UTC().Truncate(time.Second), Summary: res.Summary,
		Checks: res.Checks, ConfigFingerprint: basis.fingerprint, ImageDigest: basis.image}
	if q.Checks == nil {
		q.Checks = []environment.Check{}
	}
	if basis.cfg.Driver == environment.DriverSSH {
		q.Fingerprint = environment.HostKeyFingerprint(basis.cfg.SSH.HostKey)
	}
	doc, err := json.Marshal(q)
	if err != nil {
		return fmt.Errorf("probe_environment: %w", err)
	}
	if w.beforeWrite != nil {
		w.beforeWrite(ctx)
	}
	return db.InTx(ctx, w.deps.Pool, func(tx pgx.Tx) error {
		cur, err := db.LockEnvironment(ctx, tx, env.CompanyID, env.ID)
		if errors.Is(err, db.ErrNotFound) {
			return nil // gone meanwhile: nothing to qualify
		}
		if err != nil {
			return err
		}
		now, err := w.qualificationBasis(ctx, tx, cur)
		if err != nil {
			return err
		}
		if now.fingerprint != basis.fingerprint {
			w.deps.Log.InfoContext(ctx, "probe result dropped: the environment changed while it ran",
				"environment_id", env.ID)
			return nil
		}
		if err := db.SetEnvironmentQualification(ctx, tx, env.CompanyID, env.ID, doc); err != nil {
			return err
		}
		return db.InsertAudit(ctx, tx, db.AuditEvent{CompanyID: env.CompanyID, ActorType: db.ActorSystem,
			ActorLabel: "berth", Action: "environment.probed", TargetType: "environment", TargetID: env.ID,
			Details: map[string]any{"ok": q.OK, "config_fingerprint": q.ConfigFingerprint}})
	})
}

// probe builds the driver exactly as a run would and probes it. A driver that cannot be built
// here (bubblewrap missing, an image not built, secrets that do not open) is a failed probe with the
// reason, not an error; the error is only for a probe interrupted by its context.
func (w *ProbeEnvironmentWorker) probe(ctx context.Context, run db.Run) (environment.ProbeResult, error) {
	drv, err := w.driverFor(ctx, run)
	if err == nil {
		var res environment.ProbeResult
		if res, err = drv.Probe(ctx); err == nil {
			return res, nil
		}
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return environment.ProbeResult{}, fmt.Errorf("probe_environment: %w", ctxErr)
	}
	msg := "The probe could not be carried out: " + err.Error() + "."
	if errors.Is(err, environment.ErrDriverUnavailable) {
		msg = "The driver is not available on this node: " + err.Error() + "."
	}
	return environment.ProbeResult{OK: false, Summary: msg,
		Checks: []environment.Check{{Name: "driver", Status: environment.CheckFail, Detail: err.Error()}}}, nil
}

// qualificationBasis is what a qualification is earned for: the stored config, its fingerprint
// (with the secrets and the active image) and the active image's digest.
type qualificationBasis struct {
	cfg         environment.Config
	fingerprint string
	image       string
}

// qualificationBasis reads an environment row's basis. Secrets that do not open with this node's
// key count as none, as they do for the handlers that compare fingerprints on a change.
func (w *ProbeEnvironmentWorker) qualificationBasis(ctx context.Context, q db.Querier, env db.Environment) (qualificationBasis, error) {
	cfg, err := environment.Load(env.Driver, env.Config)
	if err != nil {
		return qualificationBasis{}, err
	}
	image, err := db.ActiveImageDigest(ctx, q, env.CompanyID, env.ID)
	if err != nil {
		return qualificationBasis{}, err
	}
	var sec environment.Secrets
	if len(env.Secrets) > 0 && w.deps.Secrets != nil {
		if b, err := w.deps.Secrets.Open(env.Secrets, environment.SecretsAAD(env.ID)); err == nil {
			if json.Unmarshal(b, &sec) != nil {
				sec = environment.Secrets{}
			}
		}
	}
	return qualificationBasis{cfg: cfg, fingerprint: environment.Fingerprint(cfg, sec, image), image: image}, nil
}
