package workspace

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Close-readiness states, from best to worst.
const (
	ReadinessReady        = "ready"
	ReadinessWithWarnings = "ready_with_warnings"
	ReadinessBlocked      = "blocked"
)

// EvaluateClose decides whether a workspace may be closed, why not, and exactly what closing would
// do. It is a pure function: the same snapshot always gives the same answer, whatever order its
// lists come in.
//
// Policy: nothing that could lose work is ever a warning. A live run or lease, a pending or failed
// finalize, an open bound task, unreadable git state, a root Berth does not own and an already
// closed workspace always block; ConfirmDestructive overrides only uncommitted or unmerged work in a
// worktree the close would delete, and then a rescue ref is written before anything is removed.
// Unknown statuses count as live or open. A shared workspace (or one whose root Berth does not own)
// is never deleted: its close stops services and archives the record, and dirty work in it blocks
// nothing because nothing is lost; open bound tasks still block, as for any workspace, because
// closing would strand their binding. The task branch is always kept. Commands name the root as
// "$BERTH_WORKSPACES"/<ref>, never as a host path.
func EvaluateClose(s CloseSnapshot) Readiness {
	w := s.Workspace
	r := Readiness{
		BlockingReasons: []CloseReason{},
		Warnings:        []CloseReason{},
		LinkedTasks:     linkedTasks(s.LinkedTasks),
		RunningServices: []RunningService{},
		PlannedActions:  []PlannedAction{},
		Shared:          w.Mode == ModeShared || w.Strategy == StrategyShared,
	}
	services := runningServices(s.Services)
	for _, svc := range services {
		r.RunningServices = append(r.RunningServices, RunningService{ID: svc.ID, Name: svc.Name, Status: svc.Status})
	}
	worktree := !r.Shared && w.Strategy == StrategyGitWorktree
	r.Git = gitView(s, worktree)
	gitKnown := r.Git != nil && r.Git.Readable

	// 1. A closed or closing workspace has nothing left to plan; other checks would only add noise.
	if w.Status == "closed" || w.Status == "closing" {
		if w.Status == "closed" {
			r.block(BlockAlreadyClosed, "This workspace is already closed. Reopen it to work in it again.")
		} else {
			r.block(BlockAlreadyClosed, "This workspace is already being closed; wait for that close to finish or fail.")
		}
		return r.settle()
	}

	// 2. Berth deletes only roots it created under its managed base, by their ref.
	deletes := false
	switch {
	case r.Shared:
	case !w.Managed:
		r.block(BlockUnmanagedPath, "Berth did not create this workspace's directory (it has no ownership record), so it never deletes it. Inspect and remove the directory by hand.")
	case !ValidRef(w.RootRel):
		r.block(BlockUnmanagedPath, "This workspace's root is not a directory directly under Berth's managed base, so Berth will not delete it. Inspect and remove it by hand.")
	case w.Strategy != StrategyGitWorktree && w.Strategy != StrategyCopy:
		r.block(BlockUnmanagedPath, "Berth does not know how to remove a workspace realized with strategy %q.", printable(string(w.Strategy)))
	default:
		deletes = true
	}

	// 3. Whatever still uses the workspace.
	if live := liveIDs(s.Runs, func(x CloseRun) (string, string) { return x.ID, x.Status }, terminalRun); len(live) > 0 {
		r.block(BlockLiveRun, "%s still using this workspace: %s. Wait for %s to end or cancel %s; a destructive close cannot skip this.",
			plural(len(live), "1 run is", "%d runs are"), listSome(live), them(len(live)), them(len(live)))
	}
	if live := liveIDs(s.Leases, func(x CloseLease) (string, string) { return x.ID, x.Status }, terminalLease); len(live) > 0 {
		r.block(BlockActiveLease, "%s still held on this workspace: %s. Wait for %s to be released or release %s from the leases page; a destructive close cannot skip this.",
			plural(len(live), "1 environment lease is", "%d environment leases are"), listSome(live), them(len(live)), them(len(live)))
	}
	switch s.FinalizeState {
	case "", FinalizeNone, FinalizeSettled:
	case FinalizePending:
		r.block(BlockFinalizePending, "The last run's work is still being finalized (committed or captured). Close once finalize has settled.")
	case FinalizeFailed:
		r.block(BlockFinalizeFailed, "Finalizing the last run's work failed, so it may not be saved. Retry finalize first; a destructive close cannot skip this.")
	default:
		r.block(BlockFinalizeFailed, "Finalize is in an unknown state (%q), so Berth cannot tell whether the work is saved. Retry finalize first.", printable(s.FinalizeState))
	}
	var open []string
	for _, t := range r.LinkedTasks {
		if t.Open {
			open = append(open, printable(t.Key)+" ("+printable(t.Status)+")")
		}
	}
	if len(open) > 0 {
		r.block(BlockOpenTasksBound, "%s still bound to this workspace: %s. Move %s to done or cancelled, or bind %s to another workspace.",
			plural(len(open), "1 open task is", "%d open tasks are"), listSome(open), them(len(open)), them(len(open)))
	}

	// 4. What is in the worktree. Unreadable state always blocks; dirty and unmerged work block only
	// where the close would delete it, and only until the closer confirms a destructive close.
	if r.Git != nil && !r.Git.Readable {
		r.block(BlockGitUnreadable, "Berth could not read this workspace's git state (%s), so it cannot tell whether closing would lose work. Repair the repository, then check again; a destructive close cannot skip this.",
			gitReason(s, worktree))
	}
	if deletes && worktree && gitKnown {
		g := r.Git
		dirty, unmerged := s.Git.WorkAtRisk()
		r.DestructiveRequired = dirty || unmerged
		if dirty && !s.ConfirmDestructive {
			r.block(BlockDirtyWorktree, "The worktree has %s; closing deletes %s. Finalize (commit) the work, or confirm a destructive close: Berth then saves it to a rescue ref first.",
				dirtyPhrase(g.Dirty, g.Untracked), them(g.Dirty+g.Untracked))
		}
		if unmerged && !s.ConfirmDestructive {
			r.block(BlockUnmergedWork, "%s %s not merged into %s. Merge %s, or confirm a destructive close: the branch is kept and a rescue ref is created first.",
				upperFirst(branchName(w, s.Git)), plural(g.Ahead, "has 1 commit", "has %d commits"), orWord(printable(w.BaseRef), "its base"), them(g.Ahead))
		}
	}

	// 5. Warnings, in a fixed order.
	if r.Shared {
		r.warn(WarnSharedWorkspace, "This is a shared workspace: closing archives only its record. Nothing on disk is deleted and no cleanup command runs.")
	}
	rescue := deletes && worktree && r.DestructiveRequired && s.ConfirmDestructive
	if rescue {
		r.warn(WarnDestructiveConfirmed, "Destructive close confirmed: Berth first snapshots the worktree (HEAD and any uncommitted or untracked files) into %s, then deletes it.",
			rescueRefName(w.RootRel))
	}
	if n := len(services); n > 0 {
		r.warn(WarnServicesWillStop, "%s will be stopped: %s.", plural(n, "1 running service", "%d running services"), listSome(serviceNames(services)))
	}
	cleanup := deletes && strings.TrimSpace(w.CleanupCommand) != ""
	if cleanup && !w.HostScriptsAllowed {
		cleanup = false
		r.warn(WarnCleanupCommandSkipped, "The project's cleanup command will not run: host scripts are not allowed for this workspace (low trust or a sandbox environment).")
	}
	if worktree && gitKnown && r.Git.Behind > 0 {
		r.warn(WarnBehindBase, "%s is %s behind %s. That loses nothing: the branch is kept as it is.",
			upperFirst(branchName(w, s.Git)), plural(r.Git.Behind, "1 commit", "%d commits"), orWord(printable(w.BaseRef), "its base"))
	}

	// 6. The plan, in execution order: stop what runs, save what would be lost, let the project clean
	// up, unregister the worktree, delete the directory, and only then archive the record.
	for _, svc := range services {
		label := fmt.Sprintf("Stop service %s: SIGTERM to its process group, SIGKILL after the grace period, then check that its port is free.", printable(svc.Name))
		command := "berth: stop service " + shellWord(svc.Name)
		if svc.PGID > 0 {
			command = "kill -TERM -- -" + strconv.Itoa(svc.PGID)
		}
		r.plan(ActionStopServices, label, command)
	}
	root := WorkspacesPlaceholder + "/" + shellWord(w.RootRel)
	if rescue {
		head := "HEAD"
		if s.Git != nil && len(s.Git.Head) >= 12 {
			head = "HEAD (" + printable(s.Git.Head[:12]) + ")"
		}
		r.plan(ActionRescueRef, fmt.Sprintf("Snapshot %s and every uncommitted or untracked file into one commit, kept at %s.", head, rescueRefName(w.RootRel)),
			"git --git-dir="+GitDirPlaceholder+" update-ref "+rescueRefName(w.RootRel)+" <snapshot-commit> ''")
	}
	if cleanup {
		r.plan(ActionCleanupCommand, "Run the project's cleanup command in the workspace root.", "cd "+root+" && /bin/sh -c "+shellWord(w.CleanupCommand))
	}
	if deletes {
		r.plan(ActionRemoveDirectory, "Delete the workspace directory.", "rm -rf -- "+root)
	}
	if deletes && worktree {
		// The worktree's registration goes after its files: its admin dir in the source repository,
		// as Berth recorded it (nothing of the workspace's own .git is read for it).
		name := w.RootRel
		if s.Git != nil && s.Git.AdminName != "" {
			name = s.Git.AdminName
		}
		r.plan(ActionGitWorktreeRemove, fmt.Sprintf("Unregister the git worktree from its repository; %s is kept.", branchName(w, s.Git)),
			"rm -rf -- "+GitDirPlaceholder+"/worktrees/"+shellWord(name))
	}
	label := "Mark the workspace closed, fenced by generation " + strconv.FormatInt(w.Generation, 10) + "."
	if !deletes {
		label = "Mark the workspace closed, fenced by generation " + strconv.FormatInt(w.Generation, 10) + "; its directory is left untouched."
	}
	r.plan(ActionArchiveRecord, label, "berth: archive execution workspace "+shellWord(w.ID)+" generation "+strconv.FormatInt(w.Generation, 10))
	return r.settle()
}

// WorkAtRisk is the one rule for what deleting a worktree in state g would lose: uncommitted or
// untracked files (dirty), and commits that are not merged into the base (unmerged). EvaluateClose
// blocks on it, and the close job checks it again before it deletes a worktree accepted as clean.
// The answer means nothing when g is not Readable.
func (g GitState) WorkAtRisk() (dirty, unmerged bool) {
	return g.Dirty > 0 || g.Untracked > 0, g.Ahead > 0 && !g.Merged
}

// settle sets the state from the reasons collected.
func (r Readiness) settle() Readiness {
	switch {
	case len(r.BlockingReasons) > 0:
		r.State = ReadinessBlocked
	case len(r.Warnings) > 0:
		r.State = ReadinessWithWarnings
	default:
		r.State = ReadinessReady
	}
	return r
}

func terminalRun(status string) bool {
	return status == "succeeded" || status == "failed" || status == "cancelled" || status == "timed_out"
}

func terminalLease(status string) bool {
	return status == "released" || status == "expired" || status == "failed"
}

// closedTask reports whether a task no longer needs its workspace; any other status is open.
func closedTask(status string) bool { return status == "done" || status == "cancelled" }

// stoppedService reports whether a service has no process left; any other status is stopped by the close.
func stoppedService(status string) bool {
	return status == "stopped" || status == "exited" || status == "failed"
}

// liveIDs returns "id (status)" for every item whose status is not terminal, sorted.
func liveIDs[T any](items []T, get func(T) (string, string), terminal func(string) bool) []string {
	var out []string
	for _, it := range items {
		id, status := get(it)
		if !terminal(status) {
			out = append(out, printable(id)+" ("+orWord(printable(status), "unknown")+")")
		}
	}
	sort.Strings(out)
	return out
}

func linkedTasks(in []CloseTask) []LinkedTask {
	out := make([]LinkedTask, 0, len(in))
	for _, t := range in {
		out = append(out, LinkedTask{ID: t.ID, Key: t.Key, Status: t.Status, Open: !closedTask(t.Status)})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Key != out[j].Key {
			return out[i].Key < out[j].Key
		}
		return out[i].ID < out[j].ID
	})
	return out
}

func runningServices(in []CloseService) []CloseService {
	var out []CloseService
	for _, s := range in {
		if !stoppedService(s.Status) {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].ID < out[j].ID
	})
	return out
}

func serviceNames(in []CloseService) []string {
	out := make([]string, len(in))
	for i, s := range in {
		out[i] = printable(s.Name)
	}
	return out
}

// gitView is the git object of the answer: nil for a workspace without git, unreadable when git
// was expected (a worktree) or attempted but could not be read.
func gitView(s CloseSnapshot, worktree bool) *CloseGit {
	switch {
	case s.Git != nil:
		g := s.Git
		if !g.Readable || s.GitErr != "" {
			return &CloseGit{}
		}
		return &CloseGit{Dirty: g.Dirty, Untracked: g.Untracked, Ahead: g.Ahead, Behind: g.Behind, Merged: g.Merged, Readable: true}
	case s.GitErr != "" || worktree:
		return &CloseGit{}
	}
	return nil
}

func gitReason(s CloseSnapshot, worktree bool) string {
	reason := s.GitErr
	if reason == "" && s.Git != nil {
		reason = s.Git.Reason
	}
	if reason == "" {
		if worktree && s.Git == nil {
			return "no git state was read for this worktree"
		}
		return "no reason given"
	}
	return redactReason(reason)
}

// absPath matches an absolute path at the start of a word in an error message.
var absPath = regexp.MustCompile(`(^|[\s'"=(\[])/[^\s'"()\[\]]*`)

// redactReason makes a git error fit for a person and for a response: absolute paths become
// <path>, control characters become spaces, and it is cut to 300 bytes.
func redactReason(s string) string {
	s = absPath.ReplaceAllString(s, "$1<path>")
	s = printable(s)
	if len(s) > 300 {
		cut := 300
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}

// printable replaces control characters with spaces and trims, so user-chosen names and tool
// output cannot forge lines in a message or label.
func printable(s string) string {
	return strings.TrimSpace(strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s))
}

func rescueRefName(ref string) string { return "refs/berth/rescue/" + ref + "-<unix-time>" }

func branchName(w CloseWorkspace, g *GitState) string {
	switch {
	case w.Branch != "":
		return "branch " + printable(w.Branch)
	case g != nil && g.Branch != "":
		return "branch " + printable(g.Branch)
	}
	return "the task branch"
}

func dirtyPhrase(dirty, untracked int) string {
	var parts []string
	if dirty > 0 {
		parts = append(parts, plural(dirty, "1 file with uncommitted changes", "%d files with uncommitted changes"))
	}
	if untracked > 0 {
		parts = append(parts, plural(untracked, "1 untracked file", "%d untracked files"))
	}
	return strings.Join(parts, " and ")
}

// plural returns one when n is 1 and otherwise many with n filled in for its %d.
func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return fmt.Sprintf(many, n)
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

func them(n int) string {
	if n == 1 {
		return "it"
	}
	return "them"
}

// listSome joins up to five items and says how many more there are.
func listSome(items []string) string {
	const max = 5
	if len(items) <= max {
		return strings.Join(items, ", ")
	}
	return strings.Join(items[:max], ", ") + fmt.Sprintf(" and %d more", len(items)-max)
}

func orWord(s, fallback string) string {
	if s == "" {
		return fallback
	}
	return s
}

// shellWord quotes s as one POSIX shell word: safe strings stay bare, anything else goes in single
// quotes, each embedded single quote closing the quotes, escaped, and reopening them.
func shellWord(s string) string {
	if s == "" {
		return "''"
	}
	safe := true
	for _, c := range []byte(s) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("@%+=:,./_-", c) >= 0) {
			safe = false
			break
		}
	}
	if safe {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
