package workspace

import (
	"container/heap"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// FileRoot is one directory a task may read, known to clients only by Name.
type FileRoot struct {
	// Name is what clients use to pick the root (for example "workspace" or a project workspace id).
	Name string
	// Dir is the absolute host directory; it never appears in a result or an error.
	Dir string
}

// FileLimits caps what a read returns; zero fields take the defaults.
type FileLimits struct {
	// MaxFileSize refuses larger files by size, without reading them (default 1 GiB).
	MaxFileSize int64
	// PreviewBytes caps the content Read returns; longer files are truncated (default 512 KiB).
	PreviewBytes int64
}

// File-resource defaults and caps.
const (
	DefaultMaxFileSize  = 1 << 30
	DefaultPreviewBytes = 512 << 10
	MaxPageSize         = 100
)

// Files serves file resources from a task's authorized roots. Paths are relative to a root and
// checked in this order: input rules (ErrBadPath, 400), the deny list on the requested path
// (ErrDenied, 403), then resolution one component at a time: a component that leaves the root through
// ".." or a symlink is ErrEscape (403), a denied component of the real path (after symlinks) is
// ErrDenied (403), a missing one ErrNotFound (404). A directory that is a git directory (a bare
// repository, or a .git directory under another name; see isGitDir) is denied like .git: a root that
// is one is ErrDenied for every path, one inside a root is ErrDenied when a path enters it and is
// pruned from listings. Only single-link regular files are read (others are ErrNotRegular or
// ErrHardLink, 403), and files over MaxFileSize are ErrTooLarge (413).
//
// Resolution never lets the kernel follow a symlink: each directory is opened with
// openat(O_NOFOLLOW|O_DIRECTORY) from its parent's descriptor and checked against the fstatat that
// classified it, and in-root symlinks are expanded by this code, so a directory swapped for a symlink
// during a request makes the request fail instead of reading elsewhere. (os.Root would follow in-root
// symlinks by itself, which would let a swap redirect a read into a denied directory after the checks;
// this walker is strictly narrower than os.Root's rules.) Results carry root-relative paths only.
type Files struct {
	roots []FileRoot
	lim   FileLimits
}

// NewFiles returns a resolver over roots (names unique and non-empty, directories absolute); the first
// root is the default when a request names none.
func NewFiles(lim FileLimits, roots ...FileRoot) (*Files, error) {
	if len(roots) == 0 {
		return nil, fmt.Errorf("new files: no roots: %w", ErrNotFound)
	}
	seen := map[string]bool{}
	for _, r := range roots {
		if r.Name == "" || seen[r.Name] || !filepath.IsAbs(r.Dir) {
			return nil, fmt.Errorf("new files: root %q: %w", r.Name, ErrUnsafePath)
		}
		seen[r.Name] = true
	}
	if lim.MaxFileSize <= 0 {
		lim.MaxFileSize = DefaultMaxFileSize
	}
	if lim.PreviewBytes <= 0 {
		lim.PreviewBytes = DefaultPreviewBytes
	}
	return &Files{roots: roots, lim: lim}, nil
}

// Entry is one listed file or directory.
type Entry struct {
	Name       string    `json:"name"`        // base name
	Path       string    `json:"path"`        // real path relative to the root
	Type       string    `json:"type"`        // "file" or "dir"
	Size       int64     `json:"size"`        // bytes; 0 for directories
	ModifiedAt time.Time `json:"modified_at"` // UTC
}

// Page is one page of a directory listing; NextCursor is empty on the last page.
type Page struct {
	Items      []Entry `json:"items"`       // sorted by name
	NextCursor string  `json:"next_cursor"` // opaque; pass back to List for the next page
}

// Content is a file's preview: UTF-8 text as is, anything else base64-encoded.
type Content struct {
	Path      string `json:"path"`      // real path relative to the root
	Size      int64  `json:"size"`      // size of the whole file
	Encoding  string `json:"encoding"`  // "utf8" or "base64"
	Content   string `json:"content"`   // at most PreviewBytes of the file, encoded
	Truncated bool   `json:"truncated"` // the file is longer than Content
}

type wantKind int

const (
	wantFile wantKind = iota
	wantDir
)

// resolved is an open, verified object inside a root.
type resolved struct {
	rel string // real path relative to the root, "" for the root itself
	fd  int    // owned by the caller
	st  unix.Stat_t
}

func (f *Files) lookup(ctx context.Context, root, p string, want wantKind) (resolved, error) {
	if err := ctx.Err(); err != nil {
		return resolved{}, err
	}
	comps, slash, err := parseRequest(p, want == wantFile)
	if err != nil {
		return resolved{}, err
	}
	for _, c := range comps {
		if DeniedName(c) {
			return resolved{}, fmt.Errorf("%q: %w", c, ErrDenied)
		}
	}
	var dir string
	for _, r := range f.roots {
		if root == "" || r.Name == root {
			dir = r.Dir
			break
		}
	}
	if dir == "" {
		return resolved{}, fmt.Errorf("root %q: %w", root, ErrNotFound)
	}
	rootfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return resolved{}, fmt.Errorf("root %q: %w", root, ErrNotFound)
	}
	if isGitDir(rootfd) {
		unix.Close(rootfd)
		return resolved{}, fmt.Errorf("root %q is a git directory: %w", root, ErrDenied)
	}
	if slash && want == wantFile {
		want = wantDir // "x/" names a directory: a file there is "not a directory", a directory is not a file
		r, err := walk(ctx, rootfd, comps, want)
		if err == nil {
			unix.Close(r.fd)
			err = fmt.Errorf("%q is a directory: %w", r.rel, ErrNotRegular)
		}
		return resolved{}, err
	}
	return walk(ctx, rootfd, comps, want)
}

// errRaced reports an object that changed between being classified and being opened.
var errRaced = fmt.Errorf("path changed during access: %w", ErrNotFound)

const (
	maxSymlinks = 40
	maxDepth    = 512
	maxSteps    = 8192
)

// walk resolves comps under rootfd (which it takes ownership of) one component at a time without
// letting the kernel follow any symlink, and returns the opened final object.
func walk(ctx context.Context, rootfd int, comps []string, want wantKind) (res resolved, err error) {
	type frame struct {
		fd   int
		name string
	}
	stack := []frame{{fd: rootfd}}
	keep := -1
	defer func() {
		for _, fr := range stack {
			if fr.fd != keep {
				unix.Close(fr.fd)
			}
		}
	}()
	relOf := func(leaf string) string {
		names := make([]string, 0, len(stack))
		for _, fr := range stack[1:] {
			names = append(names, fr.name)
		}
		if leaf != "" {
			names = append(names, leaf)
		}
		return strings.Join(names, "/")
	}
	queue := append([]string(nil), comps...)
	links, steps := 0, 0
	for len(queue) > 0 {
		if steps++; steps > maxSteps || len(stack) > maxDepth {
			return res, fmt.Errorf("path too deep: %w", ErrBadPath)
		}
		if steps%64 == 0 {
			if err := ctx.Err(); err != nil {
				return res, err
			}
		}
		c := queue[0]
		queue = queue[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(stack) == 1 {
				return res, fmt.Errorf("%q leaves the root: %w", relOf(".."), ErrEscape)
			}
			unix.Close(stack[len(stack)-1].fd)
			stack = stack[:len(stack)-1]
			continue
		}
		if DeniedName(c) {
			return res, fmt.Errorf("%q: %w", relOf(c), ErrDenied)
		}
		parent := stack[len(stack)-1].fd
		var st unix.Stat_t
		if err := unix.Fstatat(parent, c, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return res, fmt.Errorf("%q: %w", relOf(c), ErrNotFound)
		}
		last := !hasMore(queue)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFLNK:
			if links++; links > maxSymlinks {
				return res, fmt.Errorf("%q: too many symlinks: %w", relOf(c), ErrNotFound)
			}
			target, err := readlinkat(parent, c)
			if err != nil {
				return res, fmt.Errorf("%q: %w", relOf(c), errRaced)
			}
			if strings.HasPrefix(target, "/") {
				return res, fmt.Errorf("%q points outside the root: %w", relOf(c), ErrEscape)
			}
			queue = append(strings.Split(target, "/"), queue...)
		case unix.S_IFDIR:
			fd, err := unix.Openat(parent, c, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return res, fmt.Errorf("%q: %w", relOf(c), errRaced)
			}
			var fst unix.Stat_t
			if err := unix.Fstat(fd, &fst); err != nil || fst.Dev != st.Dev || fst.Ino != st.Ino {
				unix.Close(fd)
				return res, fmt.Errorf("%q: %w", relOf(c), errRaced)
			}
			if isGitDir(fd) {
				unix.Close(fd)
				return res, fmt.Errorf("%q is a git directory: %w", relOf(c), ErrDenied)
			}
			stack = append(stack, frame{fd: fd, name: c})
		case unix.S_IFREG:
			if !last {
				return res, fmt.Errorf("%q is not a directory: %w", relOf(c), ErrNotFound)
			}
			if want == wantDir {
				return res, fmt.Errorf("%q is not a directory: %w", relOf(c), ErrNotRegular)
			}
			// O_NONBLOCK and O_NOCTTY: if a FIFO or device was swapped in after the fstatat, the open
			// neither blocks nor acquires a terminal, and the fstat below refuses it.
			fd, err := unix.Openat(parent, c, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
			if err != nil {
				return res, fmt.Errorf("%q: %w", relOf(c), errRaced)
			}
			var fst unix.Stat_t
			if err := unix.Fstat(fd, &fst); err != nil || fst.Mode&unix.S_IFMT != unix.S_IFREG || fst.Dev != st.Dev || fst.Ino != st.Ino {
				unix.Close(fd)
				return res, fmt.Errorf("%q: %w", relOf(c), errRaced)
			}
			if err := unix.SetNonblock(fd, false); err != nil {
				unix.Close(fd)
				return res, err
			}
			return resolved{rel: relOf(c), fd: fd, st: fst}, nil
		default:
			if !last {
				return res, fmt.Errorf("%q is not a directory: %w", relOf(c), ErrNotFound)
			}
			return res, fmt.Errorf("%q is a %s: %w", relOf(c), fileKind(st.Mode), ErrNotRegular)
		}
	}
	if want == wantFile {
		return res, fmt.Errorf("%q is a directory: %w", relOf(""), ErrNotRegular)
	}
	top := stack[len(stack)-1]
	keep = top.fd
	var st unix.Stat_t
	if err := unix.Fstat(top.fd, &st); err != nil {
		keep = -1
		return res, err
	}
	return resolved{rel: relOf(""), fd: top.fd, st: st}, nil
}

// openFile resolves a regular, single-link file within the size cap.
func (f *Files) openFile(ctx context.Context, root, p string) (resolved, error) {
	r, err := f.lookup(ctx, root, p, wantFile)
	if err != nil {
		return resolved{}, err
	}
	if r.st.Nlink > 1 {
		unix.Close(r.fd)
		return resolved{}, fmt.Errorf("%q: %w", r.rel, ErrHardLink)
	}
	if r.st.Size > f.lim.MaxFileSize {
		unix.Close(r.fd)
		return resolved{}, fmt.Errorf("%q is %d bytes, cap %d: %w", r.rel, r.st.Size, f.lim.MaxFileSize, ErrTooLarge)
	}
	return r, nil
}

// Read returns a preview of a file: at most PreviewBytes of it (Truncated tells), as UTF-8 text when
// the bytes are valid UTF-8 without NUL, else base64.
func (f *Files) Read(ctx context.Context, root, p string) (Content, error) {
	r, err := f.openFile(ctx, root, p)
	if err != nil {
		return Content{}, fmt.Errorf("read file: %w", err)
	}
	file := os.NewFile(uintptr(r.fd), r.rel)
	defer file.Close()
	n := min(r.st.Size, f.lim.PreviewBytes)
	buf := make([]byte, n)
	k, err := io.ReadFull(file, buf)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return Content{}, fmt.Errorf("read file %q: %w", r.rel, err)
	}
	buf = buf[:k]
	truncated := r.st.Size > int64(k)
	enc, text := sniff(buf, truncated)
	return Content{Path: r.rel, Size: r.st.Size, Encoding: enc, Content: text, Truncated: truncated}, nil
}

// Open returns the verified file for a raw download together with its entry; the caller closes it.
func (f *Files) Open(ctx context.Context, root, p string) (*os.File, Entry, error) {
	r, err := f.openFile(ctx, root, p)
	if err != nil {
		return nil, Entry{}, fmt.Errorf("open file: %w", err)
	}
	return os.NewFile(uintptr(r.fd), r.rel), entryOf(path.Base(r.rel), r.rel, &r.st), nil
}

func entryOf(name, rel string, st *unix.Stat_t) Entry {
	e := Entry{Name: name, Path: rel, Type: TypeFile, Size: st.Size, ModifiedAt: time.Unix(st.Mtim.Sec, st.Mtim.Nsec).UTC()}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		e.Type, e.Size = TypeDir, 0
	}
	return e
}

// sniff picks the encoding of a preview; a rune cut by truncation does not make text binary.
func sniff(b []byte, truncated bool) (string, string) {
	t := b
	if truncated {
		for i := 1; i <= utf8.UTFMax && i <= len(t); i++ {
			if utf8.RuneStart(t[len(t)-i]) {
				if !utf8.FullRune(t[len(t)-i:]) {
					t = t[:len(t)-i]
				}
				break
			}
		}
	}
	if utf8.Valid(t) && !strings.ContainsRune(string(t), 0) {
		return "utf8", string(t)
	}
	return "base64", base64.StdEncoding.EncodeToString(b)
}

// List returns one page of the directory at p (empty for the root): regular files and directories
// only, denied names and git directories pruned, sorted by name (byte order), at most limit entries
// (1–100; 0 means 100). cursor is the NextCursor of the previous page. Each page is one streaming pass over the directory
// that keeps only the limit smallest names after the cursor in a bounded heap, so memory stays
// O(limit) for a directory of any size (time is O(entries) per page). Entries added or removed
// between pages may appear or vanish, but none repeats.
func (f *Files) List(ctx context.Context, root, p, cursor string, limit int) (Page, error) {
	if limit <= 0 || limit > MaxPageSize {
		limit = MaxPageSize
	}
	after := ""
	if cursor != "" {
		b, err := base64.RawURLEncoding.DecodeString(cursor)
		if err != nil || len(b) == 0 || len(b) > maxNameBytes {
			return Page{}, fmt.Errorf("list: bad cursor: %w", ErrBadPath)
		}
		after = string(b)
	}
	r, err := f.lookup(ctx, root, p, wantDir)
	if err != nil {
		return Page{}, fmt.Errorf("list: %w", err)
	}
	dir := os.NewFile(uintptr(r.fd), r.rel)
	defer dir.Close()

	h := &maxHeap{}
	for {
		if err := ctx.Err(); err != nil {
			return Page{}, fmt.Errorf("list: %w", err)
		}
		batch, err := dir.ReadDir(512)
		for _, de := range batch {
			name := de.Name()
			if name <= after || DeniedName(name) || !listable(name) {
				continue
			}
			t := de.Type()
			if !t.IsRegular() && !t.IsDir() {
				continue
			}
			if h.Len() == limit+1 && name >= (*h)[0] {
				continue
			}
			// Only a directory whose name would make the page is examined (about
			// limit·ln(entries/limit) of them in readdir's hash order), not every subdirectory.
			if t.IsDir() && isGitDirAt(r.fd, name) {
				continue
			}
			if h.Len() == limit+1 {
				heap.Pop(h)
			}
			heap.Push(h, name)
		}
		if err == io.EOF || len(batch) == 0 {
			break
		}
		if err != nil {
			return Page{}, fmt.Errorf("list %q: %w", r.rel, err)
		}
	}
	names := []string(*h)
	sort.Strings(names)
	var page Page
	if len(names) > limit {
		names = names[:limit]
		page.NextCursor = base64.RawURLEncoding.EncodeToString([]byte(names[limit-1]))
	}
	page.Items = make([]Entry, 0, len(names))
	for _, name := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(r.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue // vanished since the scan
		}
		if t := st.Mode & unix.S_IFMT; t != unix.S_IFREG && t != unix.S_IFDIR {
			continue
		}
		page.Items = append(page.Items, entryOf(name, path.Join(r.rel, name), &st))
	}
	return page, nil
}

// listable hides names a client could not send back as a path.
func listable(name string) bool {
	return utf8.ValidString(name) && !strings.ContainsFunc(name, isControl) && !strings.ContainsRune(name, '\\')
}

// maxHeap keeps the largest name on top so the page's smallest names can be retained.
type maxHeap []string

func (h maxHeap) Len() int           { return len(h) }
func (h maxHeap) Less(i, j int) bool { return h[i] > h[j] }
func (h maxHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *maxHeap) Push(x any)        { *h = append(*h, x.(string)) }
func (h *maxHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
