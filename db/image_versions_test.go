package db_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"berth/db"
	"berth/db/dbtest"
	"berth/workspace"
)

// imageWorld is two companies, each with a sandbox environment, for image version tests.
type imageWorld struct {
	pool                     *pgxpool.Pool
	companyA                 string
	companyB                 string
	envA, envB               string
	emptyDigest, otherDigest string
}

func newImageWorld(t *testing.T) imageWorld {
	t.Helper()
	ctx := context.Background()
	w := imageWorld{pool: dbtest.New(t), emptyDigest: workspace.Manifest{}.Digest(),
		otherDigest: "sha256:" + strings.Repeat("ab", 32)}
	for _, c := range []struct {
		slug    string
		company *string
		env     *string
	}{{"acme", &w.companyA, &w.envA}, {"beta", &w.companyB, &w.envB}} {
		if err := w.pool.QueryRow(ctx, `INSERT INTO companies (name, slug) VALUES ($1, $1) RETURNING id`, c.slug).Scan(c.company); err != nil {
			t.Fatal(err)
		}
		if err := w.pool.QueryRow(ctx, `INSERT INTO environments (company_id, name, driver) VALUES ($1, 'box', 'sandbox') RETURNING id`,
			*c.company).Scan(c.env); err != nil {
			t.Fatal(err)
		}
	}
	return w
}

func TestImageVersions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newImageWorld(t)

	if d, err := db.ActiveImageDigest(ctx, w.pool, w.companyA, w.envA); err != nil || d != "" {
		t.Fatalf("active digest without versions = %q %v, want \"\"", d, err)
	}
	if _, err := db.ActiveImageVersion(ctx, w.pool, w.companyA, w.envA); !errors.Is(err, db.ErrNotFound) {
		t.Fatalf("active version without versions: %v, want ErrNotFound", err)
	}

	err := db.InTx(ctx, w.pool, func(tx pgx.Tx) error {
		if _, err := db.LockEnvironment(ctx, tx, w.companyA, w.envA); err != nil {
			return err
		}
		for i, n := range []db.NewImageVersion{
			{CompanyID: w.companyA, EnvironmentID: w.envA, Digest: w.emptyDigest, Status: db.ImageAvailable},
			{CompanyID: w.companyA, EnvironmentID: w.envA, Digest: w.otherDigest, Size: 4096, Status: db.ImageActive},
			{CompanyID: w.companyA, EnvironmentID: w.envA, Status: db.ImageBuilding, CreatedBySession: "6f0d3a52-7a0f-4e47-9d43-0000000000aa"},
		} {
			v, err := db.CreateImageVersion(ctx, tx, n)
			if err != nil {
				return err
			}
			if v.Number != i+1 || v.Status != n.Status || v.Digest != n.Digest || v.Size != n.Size || v.CreatedBySession != n.CreatedBySession {
				t.Errorf("version %d = %+v, from %+v", i+1, v, n)
			}
		}
		// A second active version is a conflict, and the transaction stays usable.
		_, err := db.CreateImageVersion(ctx, tx, db.NewImageVersion{CompanyID: w.companyA, EnvironmentID: w.envA,
			Digest: w.otherDigest, Status: db.ImageActive})
		if !errors.Is(err, db.ErrConflict) {
			t.Errorf("second active version: %v, want ErrConflict", err)
		}
		_, err = db.ActiveImageVersion(ctx, tx, w.companyA, w.envA)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}

	active, err := db.ActiveImageVersion(ctx, w.pool, w.companyA, w.envA)
	if err != nil || active.Number != 2 || active.Digest != w.otherDigest {
		t.Fatalf("active version = %+v %v, want number 2", active, err)
	}
	if d, err := db.ActiveImageDigest(ctx, w.pool, w.companyA, w.envA); err != nil || d != w.otherDigest {
		t.Fatalf("active digest = %q %v", d, err)
	}

	// Newest first, paged by number.
	page, err := db.ImageVersions(ctx, w.pool, w.companyA, w.envA, db.ImageVersionCursor{}, 2)
	if err != nil || len(page) != 2 || page[0].Number != 3 || page[1].Number != 2 {
		t.Fatalf("first page = %+v %v, want 3, 2", page, err)
	}
	page, err = db.ImageVersions(ctx, w.pool, w.companyA, w.envA, db.ImageVersionCursor{Number: 2}, 2)
	if err != nil || len(page) != 1 || page[0].Number != 1 {
		t.Fatalf("second page = %+v %v, want 1", page, err)
	}

	// Another company sees none of them, and a malformed id is not found.
	if list, err := db.ImageVersions(ctx, w.pool, w.companyB, w.envA, db.ImageVersionCursor{}, 10); err != nil || len(list) != 0 {
		t.Fatalf("another company's list = %+v %v", list, err)
	}
	if _, err := db.ActiveImageVersion(ctx, w.pool, w.companyB, w.envA); !errors.Is(err, db.ErrNotFound) {
		t.Fatalf("another company's active version: %v, want ErrNotFound", err)
	}
	if _, err := db.ImageVersions(ctx, w.pool, w.companyA, "nope", db.ImageVersionCursor{}, 10); !errors.Is(err, db.ErrNotFound) {
		t.Fatalf("malformed id: %v, want ErrNotFound", err)
	}
	// Numbers are per environment.
	v, err := db.CreateImageVersion(ctx, w.pool, db.NewImageVersion{CompanyID: w.companyB, EnvironmentID: w.envB,
		Digest: w.emptyDigest, Status: db.ImageActive})
	if err != nil || v.Number != 1 {
		t.Fatalf("first version of another environment = %+v %v", v, err)
	}
	// The schema refuses a version of another company's environment and an available version
	// without a digest.
	for _, n := range []db.NewImageVersion{
		{CompanyID: w.companyA, EnvironmentID: w.envB, Digest: w.otherDigest, Status: db.ImageAvailable},
		{CompanyID: w.companyA, EnvironmentID: w.envA, Status: db.ImageAvailable},
	} {
		if _, err := db.CreateImageVersion(ctx, w.pool, n); err == nil || errors.Is(err, db.ErrConflict) {
			t.Errorf("CreateImageVersion(%+v) = %v, want a schema error", n, err)
		}
	}
}

func TestSetEnvironmentQualification(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newImageWorld(t)
	doc := []byte(`{"ok": true, "summary": "fine"}`)
	if err := db.SetEnvironmentQualification(ctx, w.pool, w.companyB, w.envA, doc); !errors.Is(err, db.ErrNotFound) {
		t.Fatalf("another company's environment: %v, want ErrNotFound", err)
	}
	before, err := db.EnvironmentByID(ctx, w.pool, w.companyA, w.envA)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.SetEnvironmentQualification(ctx, w.pool, w.companyA, w.envA, doc); err != nil {
		t.Fatal(err)
	}
	after, err := db.EnvironmentByID(ctx, w.pool, w.companyA, w.envA)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(after.Qualification), `"summary": "fine"`) || !after.UpdatedAt.Equal(before.UpdatedAt) {
		t.Fatalf("qualification = %s, updated_at %v → %v (want it unchanged)", after.Qualification, before.UpdatedAt, after.UpdatedAt)
	}
}

// TestImageVersionMigrationBackfill applies 0006 to a database as it was before it: each sandbox
// environment gets version 1, the empty layer with the digest package workspace computes for an
// empty tree, active; other drivers get none, and sandbox qualifications are cleared.
func TestImageVersionMigrationBackfill(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	if _, err := pool.Exec(ctx, `DROP TABLE image_versions; DELETE FROM berth_migrations WHERE version = 6`); err != nil {
		t.Fatal(err)
	}
	var company, sandbox, local string
	if err := pool.QueryRow(ctx, `INSERT INTO companies (name, slug) VALUES ('Acme', 'acme') RETURNING id`).Scan(&company); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `INSERT INTO environments (company_id, name, driver, qualification)
		VALUES ($1, 'box', 'sandbox', '{"ok": true}') RETURNING id`, company).Scan(&sandbox); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `INSERT INTO environments (company_id, name, driver, qualification)
		VALUES ($1, 'here', 'local', '{"ok": true}') RETURNING id`, company).Scan(&local); err != nil {
		t.Fatal(err)
	}
	if err := db.Migrate(ctx, pool, quiet()); err != nil {
		t.Fatal(err)
	}
	v, err := db.ActiveImageVersion(ctx, pool, company, sandbox)
	if err != nil {
		t.Fatal(err)
	}
	empty := workspace.Manifest{}.Digest()
	if v.Number != 1 || v.Digest != empty || v.Size != 0 || v.Status != db.ImageActive {
		t.Fatalf("backfilled version = %+v, want 1, active, %s", v, empty)
	}
	if list, err := db.ImageVersions(ctx, pool, company, local, db.ImageVersionCursor{}, 10); err != nil || len(list) != 0 {
		t.Fatalf("local environment's versions = %+v %v", list, err)
	}
	var cleared, kept bool
	if err := pool.QueryRow(ctx, `SELECT
		(SELECT qualification IS NULL FROM environments WHERE id = $1),
		(SELECT qualification IS NOT NULL FROM environments WHERE id = $2)`, sandbox, local).Scan(&cleared, &kept); err != nil {
		t.Fatal(err)
	}
	if !cleared || !kept {
		t.Fatalf("sandbox qualification cleared = %v, local kept = %v", cleared, kept)
	}
}
