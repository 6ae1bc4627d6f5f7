package jobs

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"encoding/pem"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"golang.org/x/crypto/ssh"

	"berth/db"
	"berth/db/dbtest"
	"berth/environment"
	"berth/environment/seal"
)

// probeWorld is one company with an ssh environment (secrets sealed as the handlers seal them)
// and a probe worker for it. The host is 127.0.0.1 port 1, so whatever the ssh driver can do on
// this node, the probe fails quickly.
type probeWorld struct {
	pool    *pgxpool.Pool
	worker  *ProbeEnvironmentWorker
	company string
	env     db.Environment
	cfg     environment.Config
	sec     environment.Secrets
}

func newProbeWorld(t *testing.T) probeWorld {
	t.Helper()
	ctx := context.Background()
	pool := dbtest.New(t)
	sealer, err := seal.New(bytes.Repeat([]byte{7}, 32))
	if err != nil {
		t.Fatal(err)
	}
	w := probeWorld{pool: pool, worker: &ProbeEnvironmentWorker{runWorker: runWorker{deps: Deps{Pool: pool,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), NodeID: "test", Secrets: sealer}}}}
	if err := pool.QueryRow(ctx, `INSERT INTO companies (name, slug) VALUES ('Acme', 'acme') RETURNING id`).Scan(&w.company); err != nil {
		t.Fatal(err)
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(map[string]any{"host": "127.0.0.1", "port": 1, "user": "deploy",
		"private_key": string(pem.EncodeToMemory(block)), "host_key": strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sshPub)))})
	cfg, sec, errs := environment.Parse(environment.DriverSSH, raw, nil)
	if len(errs) > 0 {
		t.Fatalf("ssh config: %v", errs)
	}
	sec.Salt = "test-salt"
	w.cfg, w.sec = cfg, sec
	doc, err := cfg.Document()
	if err != nil {
		t.Fatal(err)
	}
	id := "6f0d3a52-7a0f-4e47-9d43-0000000000e1"
	plain, _ := json.Marshal(sec)
	sealed, err := sealer.Seal(plain, environment.SecretsAAD(id))
	if err != nil {
		t.Fatal(err)
	}
	if w.env, err = db.CreateEnvironment(ctx, pool, db.NewEnvironment{ID: id, CompanyID: w.company, Name: "remote",
		Driver: environment.DriverSSH, Config: doc, Secrets: sealed}); err != nil {
		t.Fatal(err)
	}
	return w
}

func (w probeWorld) work(t *testing.T) {
	t.Helper()
	job := &river.Job[ProbeEnvironmentArgs]{JobRow: &rivertype.JobRow{},
		Args: ProbeEnvironmentArgs{CompanyID: w.company, EnvironmentID: w.env.ID}}
	if err := w.worker.Work(context.Background(), job); err != nil {
		t.Fatalf("probe: %v", err)
	}
}

func (w probeWorld) qualification(t *testing.T) []byte {
	t.Helper()
	env, err := db.EnvironmentByID(context.Background(), w.pool, w.company, w.env.ID)
	if err != nil {
		t.Fatal(err)
	}
	return env.Qualification
}

// TestProbeEnvironmentRecordsFailure: a probe that cannot reach its host (or whose driver this node
// lacks) is recorded as a failed qualification with the reason, the configuration fingerprint it
// was earned for and, for ssh, the pinned host key's fingerprint; it is audited as the system.
func TestProbeEnvironmentRecordsFailure(t *testing.T) {
	t.Parallel()
	w := newProbeWorld(t)
	w.work(t)
	raw := w.qualification(t)
	var q Qualification
	if err := json.Unmarshal(raw, &q); err != nil {
		t.Fatalf("qualification %s: %v", raw, err)
	}
	if q.OK || q.Summary == "" || len(q.Checks) == 0 || q.ProbedAt.IsZero() {
		t.Fatalf("qualification = %s, want a failure with a summary and checks", raw)
	}
	if want := environment.Fingerprint(w.cfg, w.sec, ""); q.ConfigFingerprint != want {
		t.Fatalf("config_fingerprint = %q, want %q", q.ConfigFingerprint, want)
	}
	if want := environment.HostKeyFingerprint(w.cfg.SSH.HostKey); q.Fingerprint != want || !strings.HasPrefix(want, "SHA256:") {
		t.Fatalf("fingerprint = %q, want %q", q.Fingerprint, want)
	}
	if strings.Contains(string(raw), "PRIVATE KEY") {
		t.Fatal("the qualification quotes the private key")
	}
	var n int
	if err := w.pool.QueryRow(context.Background(), `SELECT count(*) FROM audit_events
		WHERE target_id = $1 AND action = 'environment.probed' AND actor_type = 'system'`, w.env.ID).Scan(&n); err != nil || n != 1 {
		t.Fatalf("probe audited %d times (%v), want 1", n, err)
	}
}

// TestProbeEnvironmentDropsStaleResult: when the configuration changes while the probe runs, the
// result belongs to a configuration that no longer exists, and nothing is written.
func TestProbeEnvironmentDropsStaleResult(t *testing.T) {
	t.Parallel()
	w := newProbeWorld(t)
	changed := w.cfg
	changed.SSH.Port = 2
	doc, err := changed.Document()
	if err != nil {
		t.Fatal(err)
	}
	w.worker.beforeWrite = func(ctx context.Context) {
		if _, err := db.UpdateEnvironment(ctx, w.pool, w.company, w.env.ID, db.EnvironmentChange{Name: w.env.Name,
			Driver: w.env.Driver, Status: w.env.Status, Config: doc, Secrets: w.env.Secrets, ClearQualification: true}); err != nil {
			t.Error(err)
		}
	}
	w.work(t)
	if raw := w.qualification(t); raw != nil {
		t.Fatalf("a probe of the old configuration wrote %s", raw)
	}

	// The same holds for a change of the active image.
	w.worker.beforeWrite = func(ctx context.Context) {
		if _, err := db.CreateImageVersion(ctx, w.pool, db.NewImageVersion{CompanyID: w.company, EnvironmentID: w.env.ID,
			Digest: "sha256:" + strings.Repeat("0", 64), Status: db.ImageActive}); err != nil {
			t.Error(err)
		}
	}
	w.work(t)
	if raw := w.qualification(t); raw != nil {
		t.Fatalf("a probe of the old image wrote %s", raw)
	}

	// Unchanged, the next probe is recorded, with the active image's digest.
	w.worker.beforeWrite = nil
	w.work(t)
	var q Qualification
	if err := json.Unmarshal(w.qualification(t), &q); err != nil {
		t.Fatal(err)
	}
	if q.ImageDigest != "sha256:"+strings.Repeat("0", 64) || q.ConfigFingerprint != environment.Fingerprint(changed, w.sec, q.ImageDigest) {
		t.Fatalf("qualification after the change = %+v", q)
	}
}
