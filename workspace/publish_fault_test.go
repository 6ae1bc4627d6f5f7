package workspace

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Faults F11 and F12 of the reliability catalog on the two publish paths that put a capsule's
// bytes in place: Artifacts.Put (the content-addressed store) and Import (a capsule materialized
// into a directory). F11: the disk fills up midway (a real ENOSPC from a small tmpfs). F12: the
// process is SIGKILLed at each step between writing and renaming (a child process that kills
// itself at the step's hook, or while the data is still streaming in).

// smallFS mounts a tmpfs of size bytes on a fresh directory (it needs root: skipped otherwise).
func smallFS(t *testing.T, size int) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs needs root")
	}
	dir := filepath.Join(t.TempDir(), "fs")
	mustDo(t, os.Mkdir(dir, 0o700))
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d,mode=0700", size)); err != nil {
		t.Skipf("cannot mount a tmpfs here: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// growFS frees room on a smallFS, as an operator would before retrying.
func growFS(t *testing.T, dir string, size int) {
	t.Helper()
	mustDo(t, unix.Mount("tmpfs", dir, "tmpfs", unix.MS_REMOUNT, fmt.Sprintf("size=%d,mode=0700", size)))
}

func randomBytes(t testing.TB, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// names lists a directory's entries.
func names(t testing.TB, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	mustDo(t, err)
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// sameTree fails unless dir holds exactly files (relative path → content) as regular files.
func sameTree(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	seen := 0
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		want, ok := files[rel]
		if !ok {
			return fmt.Errorf("unexpected %s", rel)
		}
		if got := mustRead(t, p); got != want {
			return fmt.Errorf("%s: %d bytes, want %d", rel, len(got), len(want))
		}
		seen++
		return nil
	})
	if err == nil && seen != len(files) {
		err = fmt.Errorf("%d files, want %d", seen, len(files))
	}
	if err != nil {
		t.Fatalf("tree %s: %v", dir, err)
	}
}

// packed is a capsule of files, packed from a directory under parent.
func packed(t *testing.T, files map[string]string) (Capsule, []byte) {
	t.Helper()
	src := t.TempDir()
	writeFiles(t, src, files)
	var buf bytes.Buffer
	c, err := Pack(testCtx(t), src, &buf)
	mustDo(t, err)
	return c, buf.Bytes()
}

// TestArtifactPutDiskFull (F11): a Put that runs out of space fails with ENOSPC, the artifacts
// already stored stay whole, no temporary file is left, and once there is room the same Put
// succeeds.
func TestArtifactPutDiskFull(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fs := smallFS(t, 256<<10)
	a, err := NewArtifacts(fs)
	mustDo(t, err)
	old := randomBytes(t, 16<<10)
	oldDigest, _, err := a.Put(ctx, bytes.NewReader(old), "")
	mustDo(t, err)
	big := randomBytes(t, 1<<20)
	if _, _, err := a.Put(ctx, bytes.NewReader(big), ""); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("put on a full disk = %v, want ENOSPC", err)
	}
	mustDo(t, a.Verify(ctx, oldDigest))
	if got := names(t, filepath.Join(fs, "artifacts")); len(got) != 1 || got[0] != oldDigest {
		t.Fatalf("artifacts after the failed put = %v, want only the old one", got)
	}
	growFS(t, fs, 4<<20)
	d, n, err := a.Put(ctx, bytes.NewReader(big), sha(big))
	if err != nil || n != int64(len(big)) {
		t.Fatalf("retried put = %v (%d bytes)", err, n)
	}
	mustDo(t, a.Verify(ctx, d))
}

// TestImportDiskFull (F11): a capsule import that runs out of space fails with ENOSPC, leaves no
// target and no staging directory, the version published before stays whole, and once there is
// room the same import succeeds.
func TestImportDiskFull(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fs := smallFS(t, 256<<10)
	v1Files := map[string]string{"a.txt": "version one\n", "dir/b.txt": "bee\n"}
	c1, tar1 := packed(t, v1Files)
	mustDo(t, Import(ctx, bytes.NewReader(tar1), c1.Manifest, filepath.Join(fs, "v1"), Limits{}))
	v2Files := map[string]string{"a.txt": "version two\n", "big.bin": string(randomBytes(t, 1<<20))}
	c2, tar2 := packed(t, v2Files)
	target := filepath.Join(fs, "v2")
	if err := Import(ctx, bytes.NewReader(tar2), c2.Manifest, target, Limits{}); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("import on a full disk = %v, want ENOSPC", err)
	}
	if got := names(t, fs); len(got) != 1 || got[0] != "v1" {
		t.Fatalf("after the failed import the disk holds %v, want only v1 (no target, no staging)", got)
	}
	sameTree(t, filepath.Join(fs, "v1"), v1Files)
	growFS(t, fs, 8<<20)
	mustDo(t, Import(ctx, bytes.NewReader(tar2), c2.Manifest, target, Limits{}))
	sameTree(t, target, v2Files)
}

// Child process side of TestPublishKilled: BERTH_F12_KIND is put or import, BERTH_F12_STEP the
// step to die at ("write" dies while the data is still streaming in), BERTH_F12_DIR the store or
// the parent of the target, BERTH_F12_SRC the new content (a file, or a tree to pack).
const f12Env = "BERTH_F12_KIND"

func TestPublishKilledChild(t *testing.T) {
	kind := os.Getenv(f12Env)
	if kind == "" {
		t.Skip("the child half of TestPublishKilled")
	}
	step, dir, src := os.Getenv("BERTH_F12_STEP"), os.Getenv("BERTH_F12_DIR"), os.Getenv("BERTH_F12_SRC")
	die := func(s string) {
		if s == step {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		}
	}
	ctx := testCtx(t)
	var data []byte
	var c Capsule
	if kind == "put" {
		data = []byte(mustRead(t, src))
	} else {
		var buf bytes.Buffer
		var err error
		c, err = Pack(ctx, src, &buf)
		mustDo(t, err)
		data = buf.Bytes()
	}
	var r io.Reader = bytes.NewReader(data)
	if step == "write" {
		r = &killingReader{r: r, after: len(data) / 2}
	}
	var err error
	if kind == "put" {
		a, aerr := NewArtifacts(dir)
		mustDo(t, aerr)
		a.step = die
		_, _, err = a.Put(ctx, r, "")
	} else {
		err = importAt(ctx, r, c.Manifest, filepath.Join(dir, "v2"), Limits{}, die)
	}
	t.Fatalf("the child was to die at %s, but the publish returned %v", step, err)
}

// killingReader SIGKILLs its process once after bytes have been read.
type killingReader struct {
	r     io.Reader
	after int
	read  int
}

func (k *killingReader) Read(p []byte) (int, error) {
	if k.read >= k.after {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
	p = p[:min(len(p), k.after-k.read)]
	n, err := k.r.Read(p)
	k.read += n
	return n, err
}

// runKilledChild runs the child for kind and step and fails unless it died of SIGKILL.
func runKilledChild(t *testing.T, kind, step, dir, src string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestPublishKilledChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), f12Env+"="+kind, "BERTH_F12_STEP="+step, "BERTH_F12_DIR="+dir, "BERTH_F12_SRC="+src)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("%s/%s: the child was not killed: %v\n%s", kind, step, err, out)
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("%s/%s: the child ended %v, not by SIGKILL\n%s", kind, step, err, out)
	}
}

// TestPublishKilled (F12): a process SIGKILLed at every step of a publish (while writing, after
// the fsync and before the rename, after the rename and before the directory fsync) leaves the
// final path old (absent, for a new digest or version) or new and complete, never partial; the
// version published before stays whole; and the publish can simply be run again.
func TestPublishKilled(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	for _, step := range []string{"write", "synced", "renamed"} {
		t.Run("put/"+step, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			a, err := NewArtifacts(dir)
			mustDo(t, err)
			old := randomBytes(t, 4<<10)
			oldDigest, _, err := a.Put(ctx, bytes.NewReader(old), "")
			mustDo(t, err)
			content := randomBytes(t, 2<<20)
			src := filepath.Join(t.TempDir(), "new.bin")
			mustDo(t, os.WriteFile(src, content, 0o600))
			runKilledChild(t, "put", step, dir, src)
			mustDo(t, a.Verify(ctx, oldDigest))
			f, err := a.Open(sha(content))
			switch {
			case err == nil:
				f.Close()
				mustDo(t, a.Verify(ctx, sha(content))) // new, and whole
			case errors.Is(err, ErrNotFound) && step == "renamed":
				t.Fatal("killed after the rename, the new artifact is missing")
			case !errors.Is(err, ErrNotFound):
				t.Fatal(err)
			}
			for _, n := range names(t, filepath.Join(dir, "artifacts")) {
				if n != oldDigest && n != sha(content) && !strings.HasPrefix(n, ".put-") {
					t.Fatalf("unexpected entry %q in the store", n)
				}
			}
			d, _, err := a.Put(ctx, bytes.NewReader(content), sha(content))
			mustDo(t, err)
			mustDo(t, a.Verify(ctx, d))
			// The killed Put's temporary file, once old, is removed when the store is opened again.
			longAgo := time.Now().Add(-2 * stalePutAge)
			for _, n := range names(t, filepath.Join(dir, "artifacts")) {
				if strings.HasPrefix(n, ".put-") {
					mustDo(t, os.Chtimes(filepath.Join(dir, "artifacts", n), longAgo, longAgo))
				}
			}
			_, err = NewArtifacts(dir)
			mustDo(t, err)
			if got := names(t, filepath.Join(dir, "artifacts")); len(got) != 2 {
				t.Fatalf("store after reopening = %v, want the two artifacts only", got)
			}
		})
	}
	for _, step := range []string{"write", "staged", "renamed"} {
		t.Run("import/"+step, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			v1Files := map[string]string{"a.txt": "one\n"}
			c1, tar1 := packed(t, v1Files)
			mustDo(t, Import(ctx, bytes.NewReader(tar1), c1.Manifest, filepath.Join(dir, "v1"), Limits{}))
			v2Files := map[string]string{"a.txt": "two\n", "sub/big.bin": string(randomBytes(t, 2<<20)), "z.txt": "zed\n"}
			src := t.TempDir()
			writeFiles(t, src, v2Files)
			runKilledChild(t, "import", step, dir, src)
			sameTree(t, filepath.Join(dir, "v1"), v1Files)
			// The killed import's staging directory is left behind until a sweep removes it; a
			// live import's (this process's) stays.
			leftover := stagingDirs(t, dir)
			if step != "renamed" && len(leftover) != 1 {
				t.Fatalf("killed at %s: staging dirs %v, want the killed import's one", step, leftover)
			}
			live, err := os.MkdirTemp(dir, StagingPattern("v3"))
			mustDo(t, err)
			n, err := SweepStaging(dir)
			mustDo(t, err)
			if n != len(leftover) {
				t.Fatalf("sweep removed %d, want %d", n, len(leftover))
			}
			if got := stagingDirs(t, dir); len(got) != 1 || filepath.Join(dir, got[0]) != live {
				t.Fatalf("after the sweep: staging dirs %v, want only the live one %s", got, live)
			}
			mustDo(t, os.Remove(live))
			target := filepath.Join(dir, "v2")
			if _, err := os.Lstat(target); err == nil {
				sameTree(t, target, v2Files) // new, and whole
				return
			} else if step == "renamed" {
				t.Fatal("killed after the rename, the new version is missing")
			}
			c2, tar2 := packed(t, v2Files)
			mustDo(t, Import(ctx, bytes.NewReader(tar2), c2.Manifest, target, Limits{}))
			sameTree(t, target, v2Files)
		})
	}
}

// stagingDirs lists the staging directories directly in dir.
func stagingDirs(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	for _, n := range names(t, dir) {
		if strings.Contains(n, ".staging-") {
			out = append(out, n)
		}
	}
	return out
}
