package plugincheck

import (
	"debug/elf"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// libDirs are where MinimalImage looks for shared libraries.
var libDirs = []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib",
	"/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu"}

// MinimalImage makes an image layer at dir holding this host's /bin/sh, rm and mkdir (in /bin)
// and the shared libraries they load, at the paths their loader looks for them: enough for the
// suite.
func MinimalImage(dir string) error {
	for _, d := range []string{"bin", "tmp", "proc", "dev", "sys", "etc"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	done := map[string]bool{}
	for _, tool := range []string{"sh", "rm", "mkdir"} {
		bin, err := filepath.EvalSymlinks("/bin/" + tool)
		if err != nil {
			return err
		}
		if err := copyFile(bin, filepath.Join(dir, "bin", tool), 0o755); err != nil {
			return err
		}
		if err := copyLibs(bin, dir, done); err != nil {
			return err
		}
	}
	return nil
}

// copyLibs copies the loader and every library bin needs (recursively) into dir.
func copyLibs(bin, dir string, done map[string]bool) error {
	f, err := elf.Open(bin)
	if err != nil {
		return fmt.Errorf("%s: %w", bin, err)
	}
	defer f.Close()
	var need []string
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b, err := io.ReadAll(p.Open())
			if err != nil {
				return err
			}
			need = append(need, string(b[:len(b)-1]))
		}
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		return err
	}
	for _, l := range libs {
		found := ""
		for _, d := range libDirs {
			if _, err := os.Stat(filepath.Join(d, l)); err == nil {
				found = filepath.Join(d, l)
				break
			}
		}
		if found == "" {
			return fmt.Errorf("library %s of %s not found", l, bin)
		}
		need = append(need, found)
	}
	for _, p := range need {
		if done[p] {
			continue
		}
		done[p] = true
		real, err := filepath.EvalSymlinks(p)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755); err != nil {
			return err
		}
		if err := copyFile(real, filepath.Join(dir, p), 0o755); err != nil {
			return err
		}
		if err := copyLibs(real, dir, done); err != nil {
			return err
		}
	}
	return nil
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
