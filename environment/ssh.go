package environment

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"
)

// ErrHostKeyMismatch means the ssh server presented a host key other than the pinned one. Berth
// never trusts on first use: the probe and every run fail until an administrator pins the right
// key. The message names the condition, never a key.
var ErrHostKeyMismatch = errors.New("host_key_mismatch: the server's host key is not the pinned one")

// DefaultSSHBaseDir is where remote workspaces live on an ssh host ("~" is the remote user's home).
const DefaultSSHBaseDir = "~/.berth/workspaces"

const (
	// sshKeepalive is how often an idle connection is asked whether it is still there; one left
	// unanswered for sshKeepaliveMisses intervals drops the connection and the next use dials
	// again (OpenSSH's ServerAliveInterval and ServerAliveCountMax, 15 s and 3).
	sshKeepalive       = 15 * time.Second
	sshKeepaliveMisses = 3
	// sshDialTimeout bounds connecting and the ssh handshake.
	sshDialTimeout = 20 * time.Second
	// sshScriptTimeout bounds the short helper scripts (stop, release, probe steps).
	sshScriptTimeout = 2 * time.Minute
)

// sshDriver runs commands on one host over ssh as the configured user, in a copy of the workspace
// under the remote base directory. Each instance (one per lease) has its own connection, dialled
// when first needed and dropped when it breaks. The remote host is the boundary there: Berth's jail
// is for this machine.
type sshDriver struct {
	cfg         SSHConfig
	addr        string // host:port to dial
	prefix      string // "ssh:<host>:<port>", the start of every instance ref
	signer      ssh.Signer
	hostKey     ssh.PublicKey
	env         map[string]string // configured variables, secret values resolved
	baseDir     string            // remote base directory; "~/" is the remote home
	grace       time.Duration
	keepalive   time.Duration
	dialTimeout time.Duration
	drainWait   time.Duration

	mu    sync.Mutex
	conns map[string]*sshConn // by instance ref ("" for commands outside any realized workspace)
	roots map[string]sshRoot  // realized remote roots, by absolute path
}

// sshRoot is a workspace copy this driver realized: which instance holds it, under which name.
type sshRoot struct {
	instance string // instance ref
	name     string // the workspace ref, the directory's name below the base
}

// sshConn is one live connection and the keepalive loop that watches it.
type sshConn struct {
	client *ssh.Client
	done   chan struct{}
	once   sync.Once
}

func (c *sshConn) close() {
	c.once.Do(func() {
		close(c.done)
		_ = c.client.Close()
	})
}

// keyPattern is what an acquire key may hold: it is part of the instance ref and written to the
// remote lease marker.
var keyPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)

// namePattern is a workspace ref as a single remote path component.
var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

func newSSH(cfg Config, opts Options) (*sshDriver, error) {
	c := cfg.SSH
	if c.Host == "" || c.User == "" || c.Port <= 0 || c.Port > 65535 {
		return nil, fmt.Errorf("new ssh driver: host, port and user are required: %w", ErrInvalidRequest)
	}
	hostKey, _, _, _, err := ssh.ParseAuthorizedKey([]byte(c.HostKey))
	if err != nil {
		return nil, fmt.Errorf("new ssh driver: the pinned host key does not parse: %w", ErrInvalidRequest)
	}
	if opts.Secrets.PrivateKey == "" {
		return nil, fmt.Errorf("new ssh driver: no private key: %w", ErrInvalidRequest)
	}
	signer, err := ssh.ParsePrivateKey([]byte(opts.Secrets.PrivateKey))
	if err != nil { // never quote the key or the parser's view of it
		return nil, fmt.Errorf("new ssh driver: the private key does not parse (an unencrypted PEM key is needed): %w", ErrInvalidRequest)
	}
	env := make(map[string]string, len(cfg.Env))
	for _, v := range cfg.Env {
		if msg := envNameProblem(v.Name); msg != "" {
			return nil, fmt.Errorf("new ssh driver: variable %s: %w", msg, ErrInvalidRequest)
		}
		value := v.Value
		if v.Secret {
			s, ok := opts.Secrets.Env[v.Name]
			if !ok {
				return nil, fmt.Errorf("new ssh driver: secret variable %s has no value: %w", v.Name, ErrInvalidRequest)
			}
			value = s
		}
		env[v.Name] = value
	}
	port := strconv.Itoa(c.Port)
	d := &sshDriver{cfg: c, addr: net.JoinHostPort(c.Host, port), prefix: "ssh:" + c.Host + ":" + port,
		signer: signer, hostKey: hostKey, env: env, baseDir: cmp.Or(cfg.SSH.BaseDir, DefaultSSHBaseDir), grace: opts.Grace,
		keepalive: sshKeepalive, dialTimeout: sshDialTimeout, drainWait: drainWait,
		conns: map[string]*sshConn{}, roots: map[string]sshRoot{}}
	if d.grace <= 0 {
		d.grace = DefaultGrace
	}
	return d, nil
}

// Remote reports whether d runs commands on another machine: its copy of the workspace must be
// realized there before commands and synced back before finalize reads it (the ssh driver and
// plugins).
func Remote(d Driver) bool {
	_, ok := d.(interface{ remoteInstances() })
	return ok
}

// remoteInstances marks the ssh driver as Remote.
func (d *sshDriver) remoteInstances() {}

// Close drops every connection the driver holds (remote workspaces stay until Release). A driver
// is built per job; the job closes it when it is done.
func (d *sshDriver) Close() error {
	d.mu.Lock()
	conns := d.conns
	d.conns = map[string]*sshConn{}
	d.mu.Unlock()
	for _, c := range conns {
		c.close()
	}
	return nil
}

// Acquire names the instance for a lease and connects it, so a wrong host key or an unreachable
// host fails before anything is uploaded. The same key always gives the same instance.
func (d *sshDriver) Acquire(ctx context.Context, req AcquireRequest) (Instance, error) {
	if !keyPattern.MatchString(req.Key) {
		return Instance{}, fmt.Errorf("acquire: the key must be 1 to 128 letters, digits, '.', '_', ':' or '-': %w", ErrInvalidRequest)
	}
	inst := Instance{Driver: DriverSSH, Ref: d.prefix + "/" + req.Key}
	if _, err := d.client(ctx, inst.Ref); err != nil {
		return Instance{}, fmt.Errorf("acquire: %w", err)
	}
	return inst, nil
}

// keyOf checks that inst is an instance of this host and returns its key.
func (d *sshDriver) keyOf(inst Instance) (string, error) {
	rest, ok := strings.CutPrefix(inst.Ref, d.prefix+"/")
	if inst.Driver != DriverSSH || !ok || !keyPattern.MatchString(rest) {
		return "", fmt.Errorf("instance %s %q is not one of %s: %w", inst.Driver, inst.Ref, d.prefix, ErrInvalidRequest)
	}
	return rest, nil
}

// Release stops what is left of the instance's commands on the host, removes its remote
// workspace and closes its connection. A workspace that another lease realized since is left
// alone; releasing twice finds nothing and succeeds.
func (d *sshDriver) Release(ctx context.Context, inst Instance) error {
	key, err := d.keyOf(inst)
	if err != nil {
		return fmt.Errorf("release: %w", err)
	}
	sctx, cancel := context.WithTimeout(ctx, sshScriptTimeout)
	defer cancel()
	_, err = d.run(sctx, inst.Ref, d.script(releaseScript), nil, nil, key, d.graceTenths())
	d.mu.Lock()
	for root, r := range d.roots {
		if r.instance == inst.Ref {
			delete(d.roots, root)
		}
	}
	c := d.conns[inst.Ref]
	delete(d.conns, inst.Ref)
	d.mu.Unlock()
	if c != nil {
		c.close()
	}
	if err != nil {
		return fmt.Errorf("release: %w", err)
	}
	return nil
}

// client is the live connection of instance ref, dialled if there is none.
func (d *sshDriver) client(ctx context.Context, ref string) (*ssh.Client, error) {
	d.mu.Lock()
	if c := d.conns[ref]; c != nil {
		d.mu.Unlock()
		return c.client, nil
	}
	d.mu.Unlock()
	cl, err := d.dial(ctx)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if c := d.conns[ref]; c != nil { // another caller dialled meanwhile
		_ = cl.Close()
		return c.client, nil
	}
	c := &sshConn{client: cl, done: make(chan struct{})}
	d.conns[ref] = c
	go d.watch(ref, c)
	return cl, nil
}

// drop forgets c as the connection of ref (if it still is) and closes it.
func (d *sshDriver) drop(ref string, c *sshConn) {
	d.mu.Lock()
	if d.conns[ref] == c {
		delete(d.conns, ref)
	}
	d.mu.Unlock()
	c.close()
}

// watch sends keepalive@openssh.com every keepalive interval and drops the connection when a
// keepalive gets no answer within sshKeepaliveMisses intervals (a busy server or a loaded Berth
// is not a dead peer) or the connection ends.
func (d *sshDriver) watch(ref string, c *sshConn) {
	go func() {
		_ = c.client.Wait()
		d.drop(ref, c)
	}()
	t := time.NewTicker(d.keepalive)
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
			if err := keepalive(c.client, sshKeepaliveMisses*d.keepalive); err != nil {
				d.drop(ref, c)
				return
			}
		}
	}
}

// keepalive asks the server for a reply (any reply: OpenSSH answers this request with a failure)
// within wait.
func keepalive(cl *ssh.Client, wait time.Duration) error {
	ch := make(chan error, 1)
	go func() {
		_, _, err := cl.SendRequest("keepalive@openssh.com", true, nil)
		ch <- err
	}()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case err := <-ch:
		return err
	case <-t.C:
		return errors.New("keepalive: no answer")
	}
}

// dial connects and authenticates with the private key, accepting only the pinned host key.
func (d *sshDriver) dial(ctx context.Context) (*ssh.Client, error) {
	ctx, cancel := context.WithTimeout(ctx, d.dialTimeout)
	defer cancel()
	var nd net.Dialer
	nc, err := nd.DialContext(ctx, "tcp", d.addr)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", d.addr, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = nc.SetDeadline(dl)
	}
	abort := context.AfterFunc(ctx, func() { _ = nc.Close() })
	fixed := ssh.FixedHostKey(d.hostKey)
	conf := &ssh.ClientConfig{
		User: d.cfg.User,
		Auth: []ssh.AuthMethod{ssh.PublicKeys(d.signer)},
		HostKeyCallback: func(host string, remote net.Addr, key ssh.PublicKey) error {
			if fixed(host, remote, key) != nil {
				return ErrHostKeyMismatch
			}
			return nil
		},
		// Only the pinned key's algorithms: a server that also has other key types must show the
		// pinned one.
		HostKeyAlgorithms: hostKeyAlgorithms(d.hostKey),
	}
	cc, chans, reqs, err := ssh.NewClientConn(nc, d.addr, conf)
	if !abort() {
		if err == nil {
			_ = cc.Close()
		}
		return nil, fmt.Errorf("connect to %s: %w", d.addr, ctx.Err())
	}
	if err != nil {
		_ = nc.Close()
		// A server without any key of the pinned type cannot show the pinned key either.
		if errors.Is(err, ErrHostKeyMismatch) || strings.Contains(err.Error(), "no common algorithm for host key") {
			return nil, fmt.Errorf("connect to %s: %w", d.addr, ErrHostKeyMismatch)
		}
		return nil, fmt.Errorf("connect to %s: %w", d.addr, err)
	}
	_ = nc.SetDeadline(time.Time{})
	return ssh.NewClient(cc, chans, reqs), nil
}

// hostKeyAlgorithms are the signature algorithms that prove possession of key.
func hostKeyAlgorithms(key ssh.PublicKey) []string {
	if key.Type() == ssh.KeyAlgoRSA {
		return []string{ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256, ssh.KeyAlgoRSA}
	}
	return []string{key.Type()}
}

// the keepalive noticing yet is dropped and dialled again, once.
func (d *sshDriver) session(ctx context.Context, ref string) (*ssh.Client, *ssh.Session, error) {
	for attempt := 0; ; attempt++ {
		cl, err := d.client(ctx, ref)
		if err != nil {
			return nil, nil, err
		}
		s, err := cl.NewSession()
		if err == nil {
			return cl, s, nil
		}
		d.dropClient(ref, cl)
		if attempt > 0 || ctx.Err() != nil {
			return nil, nil, fmt.Errorf("ssh session: %w", err)
		}
	}
}

// run runs a remote script on the connection of instance ref (see runScriptTo).
func (d *sshDriver) run(ctx context.Context, ref, script string, stdin io.Reader, out io.Writer, args ...string) ([]byte, error) {
	_, s, err := d.session(ctx, ref)
	if err != nil {
		return nil, err
	}
	return runScriptTo(ctx, s, script, stdin, out, args...)
}

// runScriptTo runs a remote script to its end in session s (and closes it), with stdin (nil:
// empty) and standard output going to out (nil: collected and returned). A non-zero exit is an
// error carrying the end of its standard error. When ctx ends the session is closed.
func runScriptTo(ctx context.Context, s *ssh.Session, script string, stdin io.Reader, out io.Writer, args ...string) ([]byte, error) {
	defer s.Close()
	var stdout bytes.Buffer
	stderr := &tailBuffer{max: 4 << 10}
	s.Stdin, s.Stdout, s.Stderr = stdin, out, stderr
	if out == nil {
		s.Stdout = &stdout
	}
	if err := s.Start(remoteCommand(script, args...)); err != nil {
		return nil, fmt.Errorf("ssh session: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		_ = s.Close()
		select {
		case <-done:
		case <-time.After(time.Second):
		}
		return nil, ctx.Err()
	}
	if err != nil {
		var ee *ssh.ExitError
		msg := strings.TrimSpace(stderr.String())
		if errors.As(err, &ee) && msg != "" {
			return stdout.Bytes(), fmt.Errorf("remote exit %d: %s", ee.ExitStatus(), msg)
		}
		return stdout.Bytes(), fmt.Errorf("remote: %w", err)
	}
	return stdout.Bytes(), nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = t.b[len(t.b)-t.max:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

// stopFunc defines berth_stop PGID GRACE_TENTHS: SIGTERM to the group, up to the grace for it to
// go, then SIGKILL until it is gone (at most 10 s more). Zombies count as gone (an init that
// never reaps must not hold the stop), which needs /proc; without it, kill -0 decides.
const stopFunc = `berth_alive() {
	berth_g=$1
	if [ -r /proc/self/stat ]; then
		for berth_s in /proc/[0-9]*/stat; do
			IFS= read -r berth_x 2>/dev/null <"$berth_s" || continue
			berth_x=${berth_x##*) }
			set -- $berth_x
			[ "$3" = "$berth_g" ] && [ "$1" != Z ] && [ "$1" != X ] && return 0
		done
		return 1
	fi
	kill -s 0 -- "-$berth_g" 2>/dev/null
}
berth_stop() {
	berth_p=$1 berth_n=$2 berth_i=0
	kill -s TERM -- "-$berth_p" 2>/dev/null
	while berth_alive "$berth_p"; do
		if [ "$berth_i" -ge "$berth_n" ]; then kill -s KILL -- "-$berth_p" 2>/dev/null; fi
		if [ "$berth_i" -ge $((berth_n + 100)) ]; then return 1; fi
		sleep 0.1 2>/dev/null || sleep 1
		berth_i=$((berth_i + 1))
	done
	return 0
}
`

// releaseScript ($1 key, $2 grace): for each workspace whose lease marker names key, stop the
// process groups recorded for it (when the recorded leader is still the same process, or gone),
// remove the workspace, then its marker.
const releaseScript = `key=$1 grace=$2 rc=0
[ -d "$base" ] || exit 0
for f in "$base"/*.lease; do
	[ -f "$f" ] || continue
	[ "$(cat "$f" 2>/dev/null)" = "$key" ] || continue
	ws=${f%.lease}
	name=${ws##*/}
	for p in "$base/.run/$name".*; do
		[ -f "$p" ] || continue
		pg= st=
		read -r pg st <"$p" || :
		case "$pg" in '' | *[!0-9]*) rm -f "$p"; continue ;; esac
		now=$(cut -d" " -f22 "/proc/$pg/stat" 2>/dev/null) || now=
		if [ -z "$now" ] || [ "$st" = - ] || [ "$now" = "$st" ]; then berth_stop "$pg" "$grace" || rc=1; fi
		rm -f "$p"
	done
	chmod -R u+rwx "$ws" 2>/dev/null || :
	rm -rf "$ws" || rc=1
	if [ ! -e "$ws" ]; then rm -f "$f"; fi
done
exit $rc
`
