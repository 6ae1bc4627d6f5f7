package environment

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"berth/environment/jail"
	"berth/environment/netns"
)

// startJail readies the host for spec (ownership) and makes the jail's command in network n.
// start starts it (inside the workspace's network namespace when n has one); done closes the
// jail's data pipes and lets the namespace go: call it after the command has ended. The trees
// handed to the run user stay its own while the workspace is open: a runtime service may still
// be writing there after the run that started it ended.
func startJail(h jail.Host, spec jail.Spec, within, store string, n jailNetwork) (cmd *exec.Cmd, start func() error, done func(), err error) {
	spec.Network = n.network
	if spec.Env == nil {
		spec.Env = map[string]string{}
	}
	if n.ns != nil {
		n.env(spec.Env)
		if n.caBundle != "" {
			spec.ReadOnly = append(slices.Clone(spec.ReadOnly), jail.Bind{Src: n.caBundle, Dst: caBundlePath})
			for _, k := range []string{"SSL_CERT_FILE", "CURL_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "GIT_SSL_CAINFO", "NODE_EXTRA_CA_CERTS"} {
				spec.Env[k] = caBundlePath
			}
		}
	}
	c, err := h.Build(spec)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%w: %w", err, ErrInvalidRequest)
	}
	if err := h.Prepare(spec, within, store); err != nil {
		return nil, nil, nil, fmt.Errorf("%w: %w", err, ErrDriverUnavailable)
	}
	cmd, closeData, err := h.Command(c)
	if err != nil {
		return nil, nil, nil, err
	}
	start = cmd.Start
	if n.ns != nil {
		start = func() error { return n.ns.Do(cmd.Start) }
	}
	return cmd, start, func() { closeData(); n.release() }, nil
}

// jailNetwork is the network a jail gets: its workspace's own namespace (with Berth's API and
// egress proxy on its loopback), or only a loopback of its own, or, when Berth is not root and
// cannot make namespaces, the host's network (docs/network.md says what that leaves open).
type jailNetwork struct {
	network  bool             // keep the namespace bubblewrap starts in (ns, or the host's)
	ns       *netns.Namespace // the workspace's namespace, when there is one
	release  func()           // lets ns go
	caBundle string           // the roots plus Berth's egress CA, for an environment with injected credentials
}

// caBundlePath is where a jail finds the certificate bundle it trusts when its environment has
// credentials the egress proxy injects (the proxy terminates TLS for those hosts only).
const caBundlePath = "/tmp/berth-ca-bundle.pem"

// jailNet picks the network of a jail of workspace key that wants one: the key's namespace when
// this node has namespaces, else the host's. A jail that wants none gets its own loopback only.
func jailNet(nets *netns.Networks, key string, want bool, caBundle string) (jailNetwork, error) {
	n := jailNetwork{release: func() {}}
	switch {
	case !want:
		return n, nil
	case nets == nil || key == "":
		n.network = nets == nil // not root: the host's network; no key: a loopback of its own
		return n, nil
	}
	ns, release, err := nets.Acquire(key)
	if err != nil {
		return n, fmt.Errorf("network: %v: %w", err, ErrDriverUnavailable)
	}
	return jailNetwork{network: true, ns: ns, release: release, caBundle: caBundle}, nil
}

// env points a command in a workspace namespace at what Berth serves on its loopback: the API
// (BERTH_API_URL and BERTH_MCP_URL, when the command has them) and the egress proxy.
func (n jailNetwork) env(vars map[string]string) {
	if _, ok := vars["BERTH_API_URL"]; ok {
		vars["BERTH_API_URL"] = "http://" + netns.APIAddr
	}
	if _, ok := vars["BERTH_MCP_URL"]; ok {
		vars["BERTH_MCP_URL"] = "http://" + netns.APIAddr + "/mcp"
	}
	proxy := "http://" + netns.ProxyAddr
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"} {
		vars[k] = proxy
	}
	vars["ALL_PROXY"], vars["all_proxy"] = "socks5h://"+netns.SocksAddr, "socks5h://"+netns.SocksAddr
	vars["NO_PROXY"], vars["no_proxy"] = "127.0.0.1,localhost,::1", "127.0.0.1,localhost,::1"
}

// envMap turns a KEY=VALUE list into a map.
func envMap(env []string) map[string]string {
	m := make(map[string]string, len(env))
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

// configuredEnv resolves an environment's configured variables, secret values included.
func configuredEnv(cfg Config, opts Options) (map[string]string, error) {
	env := make(map[string]string, len(cfg.Env))
	for _, v := range cfg.Env {
		if v.Inject != nil {
			continue // injected by the egress proxy: never in the jail
		}
		if msg := envNameProblem(v.Name); msg != "" {
			return nil, fmt.Errorf("variable %s: %w", msg, ErrInvalidRequest)
		}
		value := v.Value
		if v.Secret {
			s, ok := opts.Secrets.Env[v.Name]
			if !ok {
				return nil, fmt.Errorf("secret variable %s has no value: %w", v.Name, ErrInvalidRequest)
			}
			value = s
		}
		env[v.Name] = value
	}
	return env, nil
}

// checkRequest refuses a malformed ExecRequest before anything starts.
func checkRequest(req ExecRequest) error {
	if strings.TrimSpace(req.Command) == "" || strings.ContainsRune(req.Command, 0) {
		return fmt.Errorf("command must be non-empty without NUL: %w", ErrInvalidRequest)
	}
	if !filepath.IsAbs(req.Dir) {
		return fmt.Errorf("dir must be an absolute path: %w", ErrInvalidRequest)
	}
	if fi, err := os.Stat(req.Dir); err != nil || !fi.IsDir() {
		return fmt.Errorf("dir is not an existing directory: %w", ErrInvalidRequest)
	}
	if err := checkTag(req.Tag); err != nil {
		return err
	}
	if req.Timeout < 0 {
		return fmt.Errorf("timeout must not be negative: %w", ErrInvalidRequest)
	}
	return nil
}

// commandEnv is a command's whole environment: base, then the environment's configured
// variables, then the request's, plus the tag (first, so it is cheap to find).
func commandEnv(req ExecRequest, base, configured map[string]string) ([]string, error) {
	vars := maps.Clone(base)
	maps.Copy(vars, configured)
	for k, v := range req.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return nil, fmt.Errorf("env %q: names need no '=' or NUL, values no NUL: %w", k, ErrInvalidRequest)
		}
		if k == TagVar && v != req.Tag {
			return nil, fmt.Errorf("env %s differs from the tag: %w", TagVar, ErrInvalidRequest)
		}
		vars[k] = v
	}
	delete(vars, TagVar)
	out := []string{TagVar + "=" + req.Tag}
	for _, k := range slices.Sorted(maps.Keys(vars)) {
		out = append(out, k+"="+vars[k])
	}
	return out, nil
}
