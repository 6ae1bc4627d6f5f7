package workspace

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// fileFixture builds <base>/root with ordinary, denied, linked and special files and <base>/outside
// with a secret that must never be served.
type fileFixture struct {
	base, root, outside string
	files               *Files
	hasDevice           bool
}

const outsideSecret = "OUTSIDE-SECRET"

func newFileFixture(t testing.TB) *fileFixture {
	t.Helper()
	base := t.TempDir()
	fx := &fileFixture{base: base, root: filepath.Join(base, "root"), outside: filepath.Join(base, "outside")}
	writeFiles(t, fx.outside, map[string]string{"secret.txt": outsideSecret, "hard": "hard"})
	writeFiles(t, fx.root, map[string]string{
		"README.md": "hello\n", "docs/guide.md": "guide", "docs/z.md": "z", ".env": "DENIED", ".env.local": "DENIED",
		".git/config": "DENIED", "sub/.git/config": "DENIED", "keys/id_rsa": "DENIED", "server.pem": "DENIED",
		"app.key": "DENIED", "node_modules/x/index.js": "DENIED", "%2e%2e": "literal", ".npmrc": "DENIED",
		"bin.dat": "\x00\x01\x02\xff", "notes.txt": "notes",
	})
	big := strings.Repeat("é", 300<<10) // 600 KiB of two-byte runes: the preview cut falls mid-rune
	writeFiles(t, fx.root, map[string]string{"big.txt": "x" + big})
	mustDo(t, os.Symlink("/etc", filepath.Join(fx.root, "link-etc")))
	mustDo(t, os.Symlink("..", filepath.Join(fx.root, "link-up")))
	mustDo(t, os.Symlink("../outside", filepath.Join(fx.root, "link-out")))
	mustDo(t, os.Symlink(filepath.Join(fx.root, "docs"), filepath.Join(fx.root, "link-abs-in")))
	mustDo(t, os.Symlink("docs", filepath.Join(fx.root, "link-in")))
	mustDo(t, os.Symlink("README.md", filepath.Join(fx.root, "link-file")))
	mustDo(t, os.Symlink(".env", filepath.Join(fx.root, "link-env")))
	mustDo(t, os.Symlink(".git", filepath.Join(fx.root, "link-git")))
	mustDo(t, os.Symlink("loop", filepath.Join(fx.root, "loop")))
	mustDo(t, os.Link(filepath.Join(fx.outside, "hard"), filepath.Join(fx.root, "hard.txt")))
	mustDo(t, unix.Mkfifo(filepath.Join(fx.root, "fifo"), 0o644))
	f, err := os.Create(filepath.Join(fx.root, "sparse"))
	mustDo(t, err)
	mustDo(t, f.Truncate(2<<30)) // 2 GiB, no blocks allocated
	f.Close()
	fx.hasDevice = unix.Mknod(filepath.Join(fx.root, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))) == nil
	fx.files, err = NewFiles(FileLimits{}, FileRoot{Name: "workspace", Dir: fx.root})
	mustDo(t, err)
	return fx
}

func TestFilesReadRefusals(t *testing.T) {
	t.Parallel()
	fx := newFileFixture(t)
	long := strings.Repeat("a", 256)
	cases := []struct {
		path string
		want error
	}{
		{"", ErrBadPath},
		{"../outside/secret.txt", ErrEscape},
		{"../../etc/passwd", ErrEscape},
		{"docs/../../outside/secret.txt", ErrEscape},
		{"a/../../b", ErrNotFound}, // "a" does not exist: resolution stops before ".."
		{"..%2foutside%2fsecret.txt", ErrNotFound},
		{"%2e%2e/outside/secret.txt", ErrNotFound},
		{"%252e%252e%252f", ErrNotFound},
		{"%c0%ae%c0%ae/outside/secret.txt", ErrNotFound},
		{"/etc/passwd", ErrBadPath},
		{"//etc/passwd", ErrBadPath},
		{"x\x00.png", ErrBadPath},
		{"README.md\x00", ErrBadPath},
		{"a\x01b", ErrBadPath},
		{"a\u0085b", ErrBadPath},
		{"..\\..\\x", ErrBadPath},
		{"docs\\guide.md", ErrBadPath},
		{"~/x", ErrBadPath},
		{"~root/.ssh/id_rsa", ErrBadPath},
		{"C:/Windows/win.ini", ErrBadPath},
		{"c:README.md", ErrBadPath},
		{"http://example.com/x", ErrBadPath},
		{"file:///etc/passwd", ErrBadPath},
		{"javascript:alert(1)", ErrBadPath},
		{"\uFF0E\uFF0E/outside/secret.txt", ErrBadPath},
		{"\uFF0E\uFF0E\uFF0Foutside", ErrBadPath},
		{"..\uFF0Foutside", ErrBadPath},
		{"\u2024\u2024/outside", ErrBadPath},
		{".\u2024/outside", ErrBadPath},
		{"\uFE52\uFE52/x", ErrBadPath},
		{"docs\u2215..\u2215..\u2215outside", ErrBadPath},
		{long, ErrBadPath},
		{strings.Repeat("a/", 2500), ErrBadPath},
		{"\xff\xfe", ErrBadPath},
		{"link-etc/passwd", ErrEscape},
		{"link-etc/", ErrEscape},
		{"link-out/secret.txt", ErrEscape},
		{"link-out/", ErrEscape},
		{"link-up/outside/secret.txt", ErrEscape},
		{"link-abs-in/guide.md", ErrEscape}, // absolute symlinks are refused even when they point inside
		{".git/config", ErrDenied},
		{".GIT/config", ErrDenied},
		{"sub/./.git/config", ErrDenied},
		{"sub//.git/config", ErrDenied},
		{"docs/../.git/config", ErrDenied},
		{".env", ErrDenied},
		{".ENV.local", ErrDenied},
		{".npmrc", ErrDenied},
		{"keys/id_rsa", ErrDenied},
		{"server.pem", ErrDenied},
		{"app.key", ErrDenied},
		{"node_modules/x/index.js", ErrDenied},
		{"link-env", ErrDenied}, // the requested name is fine; the real path is not
		{"link-git/config", ErrDenied},
		{"hard.txt", ErrHardLink},
		{"sparse", ErrTooLarge},
		{"docs", ErrNotRegular},
		{"README.md/", ErrNotRegular},
		{"README.md/x", ErrNotFound},
		{"missing.txt", ErrNotFound},
		{"loop", ErrNotFound},
		{"fifo", ErrNotRegular},
	}
	if fx.hasDevice {
		cases = append(cases, struct {
			path string
			want error
		}{"null", ErrNotRegular})
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%.40q", tc.path), func(t *testing.T) {
			t.Parallel()
			c, err := readWithDeadline(t, fx.files, tc.path)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Read(%q) = %+v, %v; want %v", tc.path, c, err, tc.want)
			}
			if strings.Contains(err.Error(), fx.base) {
				t.Fatalf("error leaks a host path: %v", err)
			}
		})
	}
}

// readWithDeadline reads in a goroutine so a blocking open (a FIFO) fails the test instead of
// hanging it.
func readWithDeadline(t testing.TB, f *Files, p string) (Content, error) {
	t.Helper()
	type result struct {
		c   Content
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := f.Read(context.Background(), "", p)
		done <- result{c, err}
	}()
	select {
	case r := <-done:
		return r.c, r.err
	case <-time.After(20 * time.Second):
		t.Fatalf("Read(%q) did not return", p)
		return Content{}, nil
	}
}

func TestFilesReadContent(t *testing.T) {
	t.Parallel()
	fx := newFileFixture(t)
	ctx := testCtx(t)
	for _, tc := range []struct{ req, path, content string }{
		{"README.md", "README.md", "hello\n"},
		{"./README.md", "README.md", "hello\n"},
		{"docs/../README.md", "README.md", "hello\n"},
		{"link-file", "README.md", "hello\n"},
		{"link-in/guide.md", "docs/guide.md", "guide"},
		{"link-in/../notes.txt", "notes.txt", "notes"},
		{"%2e%2e", "%2e%2e", "literal"}, // percent-encoding is a literal name, never decoded
	} {
		c, err := fx.files.Read(ctx, "workspace", tc.req)
		if err != nil || c.Path != tc.path || c.Content != tc.content || c.Encoding != "utf8" || c.Truncated {
			t.Errorf("Read(%q) = %+v, %v", tc.req, c, err)
		}
	}
	c, err := fx.files.Read(ctx, "", "big.txt")
	mustDo(t, err)
	if !c.Truncated || c.Encoding != "utf8" || c.Size != 1+600<<10 || len(c.Content) > DefaultPreviewBytes || !utf8.ValidString(c.Content) {
		t.Fatalf("big preview: truncated=%v enc=%s size=%d len=%d", c.Truncated, c.Encoding, c.Size, len(c.Content))
	}
	c, err = fx.files.Read(ctx, "", "bin.dat")
	mustDo(t, err)
	if c.Encoding != "base64" || c.Content != "AAEC/w==" {
		t.Fatalf("binary: %+v", c)
	}
	if _, err := fx.files.Read(ctx, "other-root", "README.md"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown root: %v", err)
	}
	f, e, err := fx.files.Open(ctx, "", "docs/guide.md")
	mustDo(t, err)
	f.Close()
	if e.Path != "docs/guide.md" || e.Size != 5 || e.Type != TypeFile {
		t.Fatalf("Open entry %+v", e)
	}
	small, err := NewFiles(FileLimits{MaxFileSize: 4}, FileRoot{Name: "w", Dir: fx.root})
	mustDo(t, err)
	if _, err := small.Read(ctx, "w", "notes.txt"); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("size cap: %v", err)
	}
}

func TestFilesList(t *testing.T) {
	t.Parallel()
	fx := newFileFixture(t)
	ctx := testCtx(t)
	var all []Entry
	cursor := ""
	for pages := 0; ; pages++ {
		if pages > 50 {
			t.Fatal("pagination does not end")
		}
		p, err := fx.files.List(ctx, "", "", cursor, 3)
		mustDo(t, err)
		if len(p.Items) > 3 {
			t.Fatalf("page of %d", len(p.Items))
		}
		all = append(all, p.Items...)
		if p.NextCursor == "" {
			break
		}
		cursor = p.NextCursor
	}
	var names []string
	for _, e := range all {
		names = append(names, e.Name)
		if e.Path != e.Name || strings.HasPrefix(e.Path, "/") {
			t.Errorf("entry path %q", e.Path)
		}
	}
	want := []string{"%2e%2e", "README.md", "big.txt", "bin.dat", "docs", "hard.txt", "keys", "notes.txt", "sparse", "sub"}
	if strings.Join(names, ",") != strings.Join(want, ",") {
		t.Fatalf("listing %v\nwant      %v", names, want)
	}
	p, err := fx.files.List(ctx, "", "link-in", "", 0)
	mustDo(t, err)
	if len(p.Items) != 2 || p.Items[0].Path != "docs/guide.md" || p.Items[0].Type != TypeFile || p.Items[0].ModifiedAt.IsZero() {
		t.Fatalf("link-in listing %+v", p)
	}
	p, err = fx.files.List(ctx, "", "sub", "", 0)
	mustDo(t, err)
	if len(p.Items) != 0 {
		t.Fatalf("denied entry not pruned: %+v", p)
	}
	for _, tc := range []struct {
		path, cursor string
		want         error
	}{
		{".git", "", ErrDenied}, {"link-git", "", ErrDenied}, {"link-etc", "", ErrEscape}, {"link-up", "", ErrEscape},
		{"README.md", "", ErrNotRegular}, {"nope", "", ErrNotFound}, {"", "!!!", ErrBadPath}, {"/", "", ErrBadPath},
	} {
		if _, err := fx.files.List(ctx, "", tc.path, tc.cursor, 0); !errors.Is(err, tc.want) {
			t.Errorf("List(%q, %q) = %v, want %v", tc.path, tc.cursor, err, tc.want)
		}
	}
}

// TestFilesSwapRace flips a directory with a symlink (to outside the root, and to a denied directory
// inside it) while reads run: no read may ever return outside or denied content.
func TestFilesSwapRace(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	root, outside := filepath.Join(base, "root"), filepath.Join(base, "outside")
	writeFiles(t, outside, map[string]string{"f": outsideSecret})
	writeFiles(t, root, map[string]string{"d/f": "inside", "real/f": "inside", ".git/f": "DENIED"})
	mustDo(t, os.Symlink("../outside", filepath.Join(root, "alt-out")))
	mustDo(t, os.Symlink(".git", filepath.Join(root, "alt-git")))
	files, err := NewFiles(FileLimits{}, FileRoot{Name: "w", Dir: root})
	mustDo(t, err)
	for _, alt := range []string{"alt-out", "alt-git"} {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		swaps := 0
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := unix.Renameat2(unix.AT_FDCWD, filepath.Join(root, "d"), unix.AT_FDCWD, filepath.Join(root, alt), unix.RENAME_EXCHANGE); err != nil {
					t.Errorf("swap: %v", err)
					return
				}
				swaps++
			}
		}()
		ok, refused := 0, 0
		for range 10_000 {
			c, err := files.Read(context.Background(), "w", "d/f")
			if err == nil {
				if c.Content != "inside" {
					close(stop)
					wg.Wait()
					t.Fatalf("read returned %q through a swapped %s", c.Content, alt)
				}
				ok++
			} else {
				refused++
			}
		}
		close(stop)
		wg.Wait()
		t.Logf("%s: %d swaps, %d reads served inside content, %d refused", alt, swaps, ok, refused)
		// Leave "d" as the real directory for the next round.
		if fi, err := os.Lstat(filepath.Join(root, "d")); err == nil && fi.Mode()&os.ModeSymlink != 0 {
			mustDo(t, unix.Renameat2(unix.AT_FDCWD, filepath.Join(root, "d"), unix.AT_FDCWD, filepath.Join(root, alt), unix.RENAME_EXCHANGE))
		}
	}
}

func TestFilesHugeDirectory(t *testing.T) {
	t.Parallel()
	const n = 100_000
	root := t.TempDir()
	dir := filepath.Join(root, "big")
	mustDo(t, os.Mkdir(dir, 0o755))
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	mustDo(t, err)
	for i := range n {
		fd, err := unix.Openat(dfd, fmt.Sprintf("f%06d", i), unix.O_CREAT|unix.O_WRONLY|unix.O_EXCL, 0o644)
		mustDo(t, err)
		unix.Close(fd)
	}
	unix.Close(dfd)
	files, err := NewFiles(FileLimits{}, FileRoot{Name: "w", Dir: root})
	mustDo(t, err)
	ctx := testCtx(t)
	p, err := files.List(ctx, "w", "big", "", 500)
	mustDo(t, err)
	if len(p.Items) != MaxPageSize || p.Items[0].Name != "f000000" || p.Items[99].Name != "f000099" || p.NextCursor == "" {
		t.Fatalf("first page: %d items, next %q", len(p.Items), p.NextCursor)
	}
	p2, err := files.List(ctx, "w", "big", p.NextCursor, 100)
	mustDo(t, err)
	if p2.Items[0].Name != "f000100" {
		t.Fatalf("second page starts at %s", p2.Items[0].Name)
	}
	// Walk the last pages from a cursor near the end; the walk terminates with every name once.
	seen := map[string]bool{}
	cursor := encodeCursor("f099749")
	for cursor != "" {
		pg, err := files.List(ctx, "w", "big", cursor, 100)
		mustDo(t, err)
		if !sort.SliceIsSorted(pg.Items, func(i, j int) bool { return pg.Items[i].Name < pg.Items[j].Name }) {
			t.Fatal("page not sorted")
		}
		for _, e := range pg.Items {
			if seen[e.Name] {
				t.Fatalf("%s listed twice", e.Name)
			}
			seen[e.Name] = true
		}
		cursor = pg.NextCursor
	}
	if len(seen) != 250 || !seen["f099999"] {
		t.Fatalf("tail pages listed %d names", len(seen))
	}
}

func encodeCursor(name string) string { return base64.RawURLEncoding.EncodeToString([]byte(name)) }

// newBareFixture is a worktree root with git directories nested in it, and bare repositories (one
// empty, one with a pushed commit) used as roots of their own, as a local source is.
func newBareFixture(t *testing.T) *Files {
	t.Helper()
	base := t.TempDir()
	tree := newRepo(t, map[string]string{"README.md": "hello\n", "src/main.go": "package main\n",
		"notes/HEAD": "not git", "notes/refs/x": "a directory named refs", "notes/objects.txt": "no objects/ here"})
	empty, pushed := filepath.Join(base, "empty.git"), filepath.Join(base, "pushed.git")
	gitT(t, base, "init", "-q", "--bare", "-b", "main", empty)
	gitT(t, base, "init", "-q", "--bare", "-b", "main", pushed)
	gitT(t, tree, "push", "-q", pushed, "main")
	// Inside the worktree: a nested bare repository with history, an empty one, a .git directory
	// copied under another name (its config says bare = false) and a symlink into a bare one.
	vendor := filepath.Join(tree, "vendor")
	mustDo(t, os.MkdirAll(vendor, 0o755))
	gitT(t, vendor, "clone", "-q", "--bare", pushed, "lib.git")
	gitT(t, vendor, "init", "-q", "--bare", "-b", "main", "blank")
	gitT(t, base, "clone", "-q", pushed, "checkout")
	mustDo(t, os.Rename(filepath.Join(base, "checkout", ".git"), filepath.Join(vendor, "backup")))
	writeFiles(t, vendor, map[string]string{"keep.txt": "kept"})
	mustDo(t, os.Symlink("lib.git", filepath.Join(vendor, "link-lib")))
	files, err := NewFiles(FileLimits{},
		FileRoot{Name: "tree", Dir: tree}, FileRoot{Name: "empty", Dir: empty}, FileRoot{Name: "pushed", Dir: pushed})
	mustDo(t, err)
	return files
}

// TestFilesBareRepository: a git directory is hidden like .git, as a root and inside one, while
// the worktree around it and a look-alike directory list and read as before.
func TestFilesBareRepository(t *testing.T) {
	t.Parallel()
	files := newBareFixture(t)
	ctx := testCtx(t)
	for _, tc := range []struct {
		name, root, path string
		list             bool
		want             error // nil: allowed
	}{
		{"empty bare root listing", "empty", "", true, ErrDenied},
		{"empty bare root objects", "empty", "objects", true, ErrDenied},
		{"empty bare root HEAD", "empty", "HEAD", false, ErrDenied},
		{"empty bare root config", "empty", "config", false, ErrDenied},
		{"empty bare root hook", "empty", "hooks/pre-commit.sample", false, ErrDenied},
		{"empty bare root missing", "empty", "nothing", false, ErrDenied},
		{"pushed bare root listing", "pushed", "", true, ErrDenied},
		{"pushed bare root refs", "pushed", "refs/heads", true, ErrDenied},
		{"pushed bare root ref", "pushed", "refs/heads/main", false, ErrDenied},
		{"pushed bare root config", "pushed", "config", false, ErrDenied},
		{"nested bare listing", "tree", "vendor/lib.git", true, ErrDenied},
		{"nested bare HEAD", "tree", "vendor/lib.git/HEAD", false, ErrDenied},
		{"nested bare packed refs", "tree", "vendor/lib.git/packed-refs", false, ErrDenied},
		{"nested bare via ..", "tree", "vendor/../vendor/lib.git/config", false, ErrDenied},
		{"nested bare via symlink", "tree", "vendor/link-lib/config", false, ErrDenied},
		{"nested bare via symlink listing", "tree", "vendor/link-lib", true, ErrDenied},
		{"nested empty bare", "tree", "vendor/blank/config", false, ErrDenied},
		{"renamed .git directory", "tree", "vendor/backup/config", false, ErrDenied},
		{"renamed .git directory listing", "tree", "vendor/backup", true, ErrDenied},
		{"worktree .git", "tree", ".git/config", false, ErrDenied},
		{"worktree listing", "tree", "", true, nil},
		{"worktree file", "tree", "src/main.go", false, nil},
		{"worktree vendor listing", "tree", "vendor", true, nil},
		{"worktree vendor file", "tree", "vendor/keep.txt", false, nil},
		{"look-alike listing", "tree", "notes", true, nil},
		{"look-alike HEAD", "tree", "notes/HEAD", false, nil},
		{"look-alike refs", "tree", "notes/refs/x", false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			op, err := "Read", error(nil)
			if tc.list {
				op = "List"
				_, err = files.List(ctx, tc.root, tc.path, "", 0)
			} else {
				_, err = files.Read(ctx, tc.root, tc.path)
			}
			if !errors.Is(err, tc.want) { // errors.Is(err, nil) is err == nil
				t.Fatalf("%s(%s, %q) = %v, want %v", op, tc.root, tc.path, err, tc.want)
			}
		})
	}

	names := func(p string) string {
		t.Helper()
		pg, err := files.List(ctx, "tree", p, "", 0)
		mustDo(t, err)
		var out []string
		for _, e := range pg.Items {
			out = append(out, e.Name)
		}
		return strings.Join(out, ",")
	}
	if got, want := names(""), "README.md,notes,src,vendor"; got != want {
		t.Fatalf("worktree root lists %s, want %s", got, want)
	}
	if got, want := names("vendor"), "keep.txt"; got != want {
		t.Fatalf("vendor lists %s, want %s (git directories pruned)", got, want)
	}
	if got, want := names("notes"), "HEAD,objects.txt,refs"; got != want {
		t.Fatalf("look-alike lists %s, want %s", got, want)
	}
}

// TestFilesBareRepositoryPagination: pruned git directories never cost a page its entries or
// repeat one.
func TestFilesBareRepositoryPagination(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	for i := range 6 {
		gitT(t, root, "init", "-q", "--bare", fmt.Sprintf("r%d.git", i))
		writeFiles(t, root, map[string]string{fmt.Sprintf("f%d.txt", i): "x"})
	}
	files, err := NewFiles(FileLimits{}, FileRoot{Name: "w", Dir: root})
	mustDo(t, err)
	ctx := testCtx(t)
	var got []string
	cursor := ""
	for pages := 0; ; pages++ {
		if pages > 10 {
			t.Fatal("pagination does not end")
		}
		p, err := files.List(ctx, "w", "", cursor, 2)
		mustDo(t, err)
		if p.NextCursor != "" && len(p.Items) != 2 {
			t.Fatalf("page %d has %d items before the last page", pages, len(p.Items))
		}
		for _, e := range p.Items {
			got = append(got, e.Name)
		}
		if cursor = p.NextCursor; cursor == "" {
			break
		}
	}
	if want := "f0.txt,f1.txt,f2.txt,f3.txt,f4.txt,f5.txt"; strings.Join(got, ",") != want {
		t.Fatalf("listed %v, want %s", got, want)
	}
}
