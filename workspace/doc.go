// Package workspace is Berth's on-disk engine: it creates execution workspace roots under a private
// managed base, realizes them from a git repository or a directory, finalizes their work (commits,
// capsules, change lists), packs and imports capsules, stores artifacts by content, and serves file
// resources from authorized roots without ever letting a request read outside them.
//
// The package speaks no HTTP and knows no database: callers record what it returns (a Result, a
// digest, a commit) in their own ledger. Everything that does I/O or runs git takes a context first,
// and every refusal is one of the sentinel errors in errors.go, wrapped once with the operation name.
//
// Layout under the data directory (every directory mode 0700):
//
//	workspaces/<ref>/           a managed root (a worktree or a copy)
//	workspaces/<ref>.record     its ownership record, outside the root so nothing inside can forge it
//	workspaces/<ref>.manifest   the base manifest of a copy, for change lists at finalize
//	git-cache/<sha256 of URL>/  bare clone of a remote source; task branches live in its refs/heads
//	git-home/                   the private HOME git runs with (no user or system config is read)
//	artifacts/<sha256>          content-addressed, immutable artifacts
//
// Git always runs with a cleared environment, hooks and fsmonitor disabled, no credential helper, no
// terminal prompt, and its process group killed when the context ends. Nothing is ever pushed.
package workspace
