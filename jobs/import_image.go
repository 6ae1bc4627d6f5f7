package jobs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"berth/db"
	"berth/environment"
	"berth/environment/oci"
	"berth/workspace"
)

// ImportImageRequest names an OCI image to turn into an environment's next image version.
type ImportImageRequest struct {
	CompanyID     string
	EnvironmentID string
	// Source is an OCI layout directory or tar, a docker save tarball (.tar, .tar.gz) or a
	// registry reference (package oci).
	Source string
	// Activate makes the new version the active one; otherwise it is kept available.
	Activate bool
	// UserID is who asked (recorded on the version and in the audit trail); "" for the system.
	UserID string
	// ActorLabel names the actor in the audit event (the user's email, or "berth").
	ActorLabel string
}

// ImportedImage is the version an import made.
type ImportedImage struct {
	Version db.ImageVersion
	Kind    string // oci.KindLayout, KindArchive or KindRegistry
	Source  string
	Skipped []string
}

// ImportImage reads the image, flattens it into a staging directory next to the environment's
// versions (oci.Flatten: whiteouts applied, escapes and device nodes refused, owners mapped to
// Berth's user), then in one transaction numbers it, renames it into place as that version's
// layer, records its manifest digest and source, activates it if asked, and writes the audit
// event. A failure anywhere leaves no version row and no layer; the active version is unchanged.
func ImportImage(ctx context.Context, deps Deps, req ImportImageRequest) (ImportedImage, error) {
	if deps.Data.Root == "" {
		return ImportedImage{}, errors.New("import image: no data dir")
	}
	env, err := db.EnvironmentByID(ctx, deps.Pool, req.CompanyID, req.EnvironmentID)
	if err != nil {
		return ImportedImage{}, fmt.Errorf("import image: %w", err)
	}
	if env.Driver != environment.DriverSandbox && env.Driver != environment.DriverPlugin {
		return ImportedImage{}, fmt.Errorf("import image: %s environments have no image versions (sandbox and plugin ones do): %w",
			env.Driver, db.ErrConflict)
	}
	envDir := deps.Data.EnvironmentImages(env.ID)
	if err := os.MkdirAll(envDir, 0o755); err != nil {
		return ImportedImage{}, fmt.Errorf("import image: %w", err)
	}
	img, err := oci.Open(ctx, req.Source, envDir)
	if err != nil {
		return ImportedImage{}, fmt.Errorf("import image: %w", err)
	}
	defer img.Close()
	staging, err := os.MkdirTemp(envDir, workspace.StagingPattern("import")) // swept if the process dies (SweepImageStaging)
	if err != nil {
		return ImportedImage{}, fmt.Errorf("import image: %w", err)
	}
	defer os.RemoveAll(staging)
	tree := filepath.Join(staging, "tree")
	if err := os.Mkdir(tree, 0o755); err != nil {
		return ImportedImage{}, fmt.Errorf("import image: %w", err)
	}
	res, err := oci.Flatten(ctx, img, tree, oci.Limits{})
	if err != nil {
		return ImportedImage{}, fmt.Errorf("import image: %w", err)
	}
	out := ImportedImage{Kind: img.Kind, Source: img.Source, Skipped: res.Skipped}
	err = db.InTx(ctx, deps.Pool, func(tx pgx.Tx) error {
		if _, err := db.LockEnvironment(ctx, tx, env.CompanyID, env.ID); err != nil {
			return err
		}
		v, err := db.CreateImageVersion(ctx, tx, db.NewImageVersion{CompanyID: env.CompanyID, EnvironmentID: env.ID,
			Digest: res.Digest, Size: res.Bytes, Status: db.ImageAvailable, CreatedBy: req.UserID})
		if err != nil {
			return err
		}
		if err := db.SetImageVersionSource(ctx, tx, env.CompanyID, v.ID, img.Kind+" "+img.Source); err != nil {
			return err
		}
		layer := deps.Data.ImageLayer(env.ID, v.Number)
		// No committed row has this number: whatever is there is a crashed attempt's leftover.
		if err := os.RemoveAll(layer); err != nil {
			return fmt.Errorf("import image: clear %d: %w", v.Number, err)
		}
		if err := os.Rename(tree, layer); err != nil {
			return fmt.Errorf("import image: place %d: %w", v.Number, err)
		}
		prev := 0
		if req.Activate {
			p, cur, err := db.ActivateImageVersion(ctx, tx, env.CompanyID, env.ID, v.Number)
			if err != nil {
				_ = os.RemoveAll(layer)
				return err
			}
			prev, v = p.Number, cur
		}
		out.Version = v
		actor := db.AuditEvent{CompanyID: env.CompanyID, ActorType: db.ActorSystem, ActorLabel: "berth"}
		if req.UserID != "" {
			actor.ActorType, actor.ActorID, actor.ActorLabel = db.ActorUser, req.UserID, req.ActorLabel
		}
		actor.Action, actor.TargetType, actor.TargetID = "image_version.imported", "environment", env.ID
		actor.Details = map[string]any{"version": v.Number, "digest": res.Digest, "size": res.Bytes, "source_kind": img.Kind,
			"source": img.Source, "activated": req.Activate, "previous_version": prev, "skipped": len(res.Skipped)}
		if err := db.InsertAudit(ctx, tx, actor); err != nil {
			_ = os.RemoveAll(layer)
			return err
		}
		return nil
	})
	if err != nil {
		return ImportedImage{}, err
	}
	if deps.Log != nil {
		deps.Log.InfoContext(ctx, "image imported", "environment_id", env.ID, "version", out.Version.Number, "digest", res.Digest)
	}
	return out, nil
}

// ImportImageArgs asks a worker to import an image (the environment page's form): a registry
// reference, or an upload Berth stored under the data dir (removed after the import).
type ImportImageArgs struct {
	CompanyID     string `json:"company_id"`
	EnvironmentID string `json:"environment_id"`
	Source        string `json:"source"`
	Upload        bool   `json:"upload"` // Source is an uploaded file in <data dir>/uploads
	Activate      bool   `json:"activate"`
	UserID        string `json:"user_id"`
	ActorLabel    string `json:"actor_label"`
}

// Kind names the job in River.
func (ImportImageArgs) Kind() string { return "import_image" }

// InsertOpts: a failed import is reported, not retried forever.
func (ImportImageArgs) InsertOpts() river.InsertOpts { return river.InsertOpts{MaxAttempts: 3} }

// ImportImageWorker runs ImportImage for the form.
type ImportImageWorker struct {
	river.WorkerDefaults[ImportImageArgs]
	deps Deps
}

// Work imports the image; an upload is removed once the import succeeded or gave up.
func (w *ImportImageWorker) Work(ctx context.Context, job *river.Job[ImportImageArgs]) error {
	a := job.Args
	source := a.Source
	if a.Upload {
		if filepath.Base(source) != source || source == "" {
			return river.JobCancel(fmt.Errorf("import_image: bad upload name"))
		}
		source = filepath.Join(w.deps.Data.Uploads(), source)
	}
	_, err := ImportImage(ctx, w.deps, ImportImageRequest{CompanyID: a.CompanyID, EnvironmentID: a.EnvironmentID, Source: source,
		Activate: a.Activate, UserID: a.UserID, ActorLabel: a.ActorLabel})
	if a.Upload && (err == nil || job.Attempt >= job.MaxAttempts || errors.Is(err, oci.ErrSource) || errors.Is(err, oci.ErrUnsafe)) {
		_ = os.Remove(source)
	}
	if errors.Is(err, oci.ErrSource) || errors.Is(err, oci.ErrUnsafe) || errors.Is(err, db.ErrNotFound) {
		return river.JobCancel(err)
	}
	return err
}
