package environment

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"strconv"
)

// PluginRunAs is the identity plugins run as on this host: PluginUser (created on first use: a
// system user with no home and no login shell) when Berth runs as root, nil (Berth's own) when
// it does not.
func PluginRunAs(ctx context.Context) (*PluginIdentity, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(PluginUser)
	if err != nil {
		var unknown user.UnknownUserError
		if !errors.As(err, &unknown) {
			return nil, fmt.Errorf("look up %s: %w", PluginUser, err)
		}
		out, err := exec.CommandContext(ctx, "useradd", "--system", "--user-group", "--no-create-home",
			"--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", PluginUser).CombinedOutput()
		if u2, err2 := user.Lookup(PluginUser); err2 == nil { // made now, or by a concurrent Berth
			u = u2
		} else {
			return nil, fmt.Errorf("create the %s user: %v: %s", PluginUser, err, out)
		}
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err1 != nil || err2 != nil || uid == 0 {
		return nil, fmt.Errorf("%s has unusable ids %s/%s", PluginUser, u.Uid, u.Gid)
	}
	return &PluginIdentity{UID: uid, GID: gid}, nil
}
