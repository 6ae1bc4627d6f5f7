package workspace

import "errors"

// Sentinel errors: every refusal of this package wraps exactly one of these, so callers map them to
// HTTP codes and ledger states with errors.Is. The suggested HTTP status is given for the file
// resource errors.
var (
	// ErrBusy means the workspace has a live holder (see Manager.Acquire) or is being destroyed.
	ErrBusy = errors.New("workspace busy")
	// ErrNotManaged means the ref or directory is not one this Manager created and owns (including
	// shared workspaces, whose directory belongs to the project).
	ErrNotManaged = errors.New("not a managed workspace")
	// ErrBadRef means a string is not a well-formed workspace ref (ws- followed by 32 lowercase hex).
	ErrBadRef = errors.New("invalid workspace ref")
	// ErrUnsafePath means a source or target path is unusable for safety reasons (relative where an
	// absolute path is needed, a symlink where a directory is needed, a non-empty target).
	ErrUnsafePath = errors.New("unsafe path")

	// ErrBadPath means a requested file-resource path is malformed (HTTP 400).
	ErrBadPath = errors.New("malformed path")
	// ErrEscape means a requested path leaves its root through .. or a symlink (HTTP 403).
	ErrEscape = errors.New("path escapes root")
	// ErrDenied means a requested or resolved path names a denied file such as .git or .env (HTTP 403).
	ErrDenied = errors.New("path denied")
	// ErrNotFound means the path, root or artifact does not exist (HTTP 404).
	ErrNotFound = errors.New("not found")
	// ErrNotRegular means the path is not a regular file (directory, FIFO, device, socket) where a file
	// is required, or not a directory where one is required (HTTP 403 for special files).
	ErrNotRegular = errors.New("not a regular file")
	// ErrHardLink means a file has more than one hard link, so its path proves nothing about where its
	// content lives (HTTP 403).
	ErrHardLink = errors.New("file has several hard links")
	// ErrTooLarge means a file is over the size cap; it is refused by size without being read (HTTP 413).
	ErrTooLarge = errors.New("file too large")

	// ErrBadBranch means a rendered branch name or ref name fails git's ref-format rules.
	ErrBadBranch = errors.New("invalid branch name")
	// ErrBranchConflict means the task branch already exists with history that does not descend from
	// the base commit.
	ErrBranchConflict = errors.New("branch exists with unrelated history")
	// ErrBranchInUse means the task branch is checked out in a worktree that cannot be reused.
	ErrBranchInUse = errors.New("branch checked out elsewhere")
	// ErrWrongBranch means a worktree is not on the branch the caller expected.
	ErrWrongBranch = errors.New("worktree on unexpected branch")
	// ErrGit means a git command failed; the wrapped message carries git's stderr (never a secret).
	ErrGit = errors.New("git failed")

	// ErrCapsule means a capsule stream or manifest was rejected (traversal, link, device, duplicate,
	// mismatch, trailing data, malformed tar).
	ErrCapsule = errors.New("invalid capsule")
	// ErrQuota means an import or copy exceeds its entry-count or byte limits.
	ErrQuota = errors.New("over quota")
	// ErrSourceTooLarge means a copy realization's source holds more bytes or files than the copy
	// quota allows; nothing was copied.
	ErrSourceTooLarge = errors.New("source too large to copy")
	// ErrDigest means a digest string is malformed or content does not match its digest.
	ErrDigest = errors.New("digest mismatch")
)
