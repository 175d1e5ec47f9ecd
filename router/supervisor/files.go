package supervisor

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/switchyard-router/switchyard/router/config"
)

// FileSum is the checksum of one file a plugin process runs, taken before
// the process started (PluginInfo.Files).
type FileSum struct {
	// Path is the file's absolute path (config.Plugin.Files).
	Path string `json:"path"`
	// SHA256 is its SHA-256 in lowercase hex, as sha256sum prints it; ""
	// when it could not be read (Error says why).
	SHA256 string `json:"sha256,omitempty"`
	// Error says why the file was not hashed: it cannot be read, it is
	// not a regular file, or it is over config.MaxPluginFileSize.
	Error string `json:"error,omitempty"`
}

// PluginInfo is what a plugin's current process runs (Host.Info): the
// version it reported, the checksums of its files and when it started.
type PluginInfo struct {
	// Version is the process's DescribeResponse.plugin_version ("" when
	// the plugin reports none).
	Version string
	// Started is when the host adopted the process: its handshake and
	// Describe done (again at each restart).
	Started time.Time
	// PID is the process id (also its process group's).
	PID int
	// Files are the checksums of config.Plugin.Files, in that order: the
	// executable first, then the files among args and in sha256_files,
	// read (up to config.MaxPluginFileSize each) just before the process
	// was started.
	Files []FileSum
}

// SHA256 is the executable's checksum (Files[0]); "" when it is unknown.
func (i PluginInfo) SHA256() string {
	if len(i.Files) == 0 {
		return ""
	}
	return i.Files[0].SHA256
}

// errFileTooLarge is hashFile's error for a file over its limit.
var errFileTooLarge = errors.New("file too large")

// hashFile returns the SHA-256 of the regular file at path (following
// symlinks) in lowercase hex, reading at most limit bytes: a larger file
// is an error wrapping errFileTooLarge, as is one that is not a regular
// file (a FIFO would block the read).
func hashFile(path string, limit int64) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }()
	fi, err := f.Stat()
	if err != nil {
		return "", err
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file (%v)", path, fi.Mode().Type())
	}
	h := sha256.New()
	n, err := io.Copy(h, io.LimitReader(f, limit+1))
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", path, err)
	}
	if n > limit {
		return "", fmt.Errorf("%s: %w: over the %d MiB the router hashes", path, errFileTooLarge, limit>>20)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// fileSums hashes the files b runs (config.Plugin.Files).
func fileSums(b config.Plugin) []FileSum {
	files := b.Files()
	out := make([]FileSum, len(files))
	for i, path := range files {
		out[i].Path = path
		if sum, err := hashFile(path, config.MaxPluginFileSize); err != nil {
			out[i].Error = err.Error()
		} else {
			out[i].SHA256 = sum
		}
	}
	return out
}

// checkPins compares the sha256_files pins of b with sums (fileSums of b):
// a pinned file whose checksum differs, or that could not be hashed, is an
// error naming the file, both checksums and the pin as written.
func checkPins(b config.Plugin, sums []FileSum) error {
	var errs []error
	for _, key := range sortedKeys(b.SHA256Files) {
		want := b.SHA256Files[key]
		abs, err := filepath.Abs(key)
		if err != nil {
			errs = append(errs, fmt.Errorf("sha256_files %q: %w", key, err))
			continue
		}
		i := slices.IndexFunc(sums, func(s FileSum) bool { return s.Path == abs })
		switch {
		case i < 0:
			errs = append(errs, fmt.Errorf("sha256_files %q: %s was not hashed", key, abs))
		case sums[i].Error != "":
			errs = append(errs, fmt.Errorf("sha256_files %q pins %s, which cannot be hashed: %s; the plugin was not run", key, abs, sums[i].Error))
		case sums[i].SHA256 != want:
			errs = append(errs, fmt.Errorf("sha256 mismatch: %s has sha256 %s, sha256_files pins %s for %q; the plugin was not run", abs, sums[i].SHA256, want, key))
		}
	}
	return errors.Join(errs...)
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// info is p's PluginInfo; call it once adopt set upSince.
func (p *proc) info() PluginInfo {
	return PluginInfo{Version: p.version, Started: p.upSince, PID: p.pid, Files: slices.Clone(p.files)}
}

// filesLabel is switchyard_plugin_info's files_sha256: the checksums of
// the files after the executable, comma-separated in order ("-" for one
// that could not be hashed).
func filesLabel(files []FileSum) string {
	var sb strings.Builder
	for i, f := range files {
		if i == 0 {
			continue
		}
		if i > 1 {
			sb.WriteByte(',')
		}
		if f.SHA256 == "" {
			sb.WriteByte('-')
		} else {
			sb.WriteString(f.SHA256)
		}
	}
	return sb.String()
}
