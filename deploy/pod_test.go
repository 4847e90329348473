package deploy

// The pods' users and the files they read: the job manifests against the
// images' USER and against the launcher's own check of its credentials file.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/meshrun/meshrun/bootstrap/natsconn/creds"
)

// imageUser is the numeric uid and gid the last stage of a Dockerfile runs
// as (its last USER line).
func imageUser(t *testing.T, dockerfile string) (uid, gid int64) {
	t.Helper()
	data, err := os.ReadFile(dockerfile)
	if err != nil {
		t.Fatal(err)
	}
	stages := regexp.MustCompile(`(?m)^FROM `).Split(string(data), -1)
	users := regexp.MustCompile(`(?m)^USER\s+(\S+)\s*$`).FindAllStringSubmatch(stages[len(stages)-1], -1)
	if len(users) == 0 {
		t.Fatalf("%s: the final stage sets no USER", dockerfile)
	}
	u, g, _ := strings.Cut(users[len(users)-1][1], ":")
	uid, err1 := strconv.ParseInt(u, 10, 64)
	gid, err2 := strconv.ParseInt(g, 10, 64)
	if err1 != nil || err2 != nil {
		// Kubernetes' runAsNonRoot cannot verify a user name, only a uid.
		t.Fatalf("%s: USER %s: want numeric uid:gid", dockerfile, users[len(users)-1][1])
	}
	return uid, gid
}

// dockerfileOf is the Dockerfile that builds a meshrun image.
func dockerfileOf(image string) string {
	if strings.HasSuffix(image, ":cuda") {
		return "Dockerfile.cuda"
	}
	return "Dockerfile"
}

// TestPodSecurity checks every job's pod against its image: it runs as the
// image's own non-root user and group (USER of the Dockerfile), with what the
// "restricted" Pod Security Standard asks (no privilege escalation, every
// capability dropped, the runtime's default seccomp profile), and without a
// Kubernetes API token it has no use for.
func TestPodSecurity(t *testing.T) {
	for _, f := range manifests(t, "k8s/job-*.yaml") {
		t.Run(f, func(t *testing.T) {
			job := one[*batchv1.Job](t, load(t, f))
			spec := &job.Spec.Template.Spec
			launcher := container(spec, "launcher")
			if launcher == nil {
				t.Fatal("no container named launcher")
			}
			uid, gid := imageUser(t, dockerfileOf(launcher.Image))
			if uid == 0 || gid == 0 {
				t.Fatalf("%s runs as %d:%d, want a non-root user", dockerfileOf(launcher.Image), uid, gid)
			}
			psc := spec.SecurityContext
			if psc == nil {
				t.Fatal("no pod securityContext")
			}
			if psc.FSGroup == nil || *psc.FSGroup != gid {
				t.Errorf("fsGroup %v, want the image's group %d (the credentials copy reads the Secret through it)", idStr(psc.FSGroup), gid)
			}
			if psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
				t.Errorf("seccompProfile %v, want RuntimeDefault", psc.SeccompProfile)
			}
			if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
				t.Error("automountServiceAccountToken: want false (nothing in the pod calls the Kubernetes API)")
			}
			for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
				u, g, nonRoot := effectiveUser(spec, &c)
				if u != uid || g != gid || !nonRoot {
					t.Errorf("container %s runs as %s:%s (runAsNonRoot %v), want %d:%d, runAsNonRoot true (the image's USER)", c.Name, idStr(u), idStr(g), nonRoot, uid, gid)
				}
				sc := c.SecurityContext
				if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
					sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
					t.Errorf("container %s: want allowPrivilegeEscalation false and capabilities drop [ALL], nothing added", c.Name)
				}
				if sc != nil && sc.Privileged != nil && *sc.Privileged {
					t.Errorf("container %s is privileged", c.Name)
				}
			}
		})
	}
}

// idStr prints a uid or gid, a pointer to one, or "unset" for nil or -1
// (effectiveUser's unset).
func idStr(p any) string {
	switch v := p.(type) {
	case *int64:
		if v != nil {
			return strconv.FormatInt(*v, 10)
		}
	case int64:
		if v >= 0 {
			return strconv.FormatInt(v, 10)
		}
	}
	return "unset"
}

// effectiveUser is the uid and gid container c runs as and whether
// runAsNonRoot holds for it: the container's securityContext over the
// pod's. An unset uid or gid is -1 (the image's, which these checks do not
// assume).
func effectiveUser(spec *corev1.PodSpec, c *corev1.Container) (uid, gid int64, nonRoot bool) {
	uid, gid = -1, -1
	if p := spec.SecurityContext; p != nil {
		uid, gid, nonRoot = deref(p.RunAsUser, uid), deref(p.RunAsGroup, gid), derefBool(p.RunAsNonRoot, nonRoot)
	}
	if s := c.SecurityContext; s != nil {
		uid, gid, nonRoot = deref(s.RunAsUser, uid), deref(s.RunAsGroup, gid), derefBool(s.RunAsNonRoot, nonRoot)
	}
	return uid, gid, nonRoot
}

func deref(p *int64, def int64) int64 {
	if p == nil {
		return def
	}
	return *p
}

func derefBool(p *bool, def bool) bool {
	if p == nil {
		return def
	}
	return *p
}

// podFile is a file as a container sees it: owner, group and mode, as
// Kubernetes makes them.
type podFile struct {
	uid, gid int64
	mode     os.FileMode
	how      string
}

func (f podFile) String() string {
	return fmt.Sprintf("%s, owner %d:%d, mode %04o", f.how, f.uid, f.gid, f.mode)
}

// copyScript is the one way these checks know to put a file into an emptyDir:
// an init container running /bin/sh -c with this script, which creates DST
// with mode 0666 &^ UMASK, owned by the container's user:
//
//	rm -f DST && umask UMASK && cat SRC > DST
var copyScript = regexp.MustCompile(`^rm -f (\S+) && umask (0[0-7]{3}) && cat (\S+) > (\S+)$`)

// fileAt models the file container c sees at path. The Kubernetes semantics
// it relies on (pkg/volume/secret and pkg/volume/volume_linux.go of
// kubernetes/kubernetes):
//
//   - a secret volume's files are written by the kubelet, which runs as
//     root: owner 0, group 0, mode the item's mode, else defaultMode, else
//     0644;
//   - with the pod's fsGroup set, the kubelet then chowns them to group
//     fsGroup and ORs their mode with 0440 (secret volumes are read-only; a
//     writable volume gets 0660): defaultMode 0400 becomes 0440. Nothing
//     makes the owner the pod's runAsUser (the secret volume's defaultUser
//     field is alpha in 1.37, behind the AtomicWriteVolumeUserFields feature
//     gate, off by default; these checks treat it as unset);
//   - an emptyDir holds what a container wrote there: here an init
//     container's copyScript.
func fileAt(spec *corev1.PodSpec, c *corev1.Container, path string) (podFile, error) {
	var mount *corev1.VolumeMount
	for i, m := range c.VolumeMounts {
		if strings.HasPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/") && (mount == nil || len(m.MountPath) > len(mount.MountPath)) {
			mount = &c.VolumeMounts[i]
		}
	}
	if mount == nil {
		return podFile{}, fmt.Errorf("container %s: no volume mounted over %s", c.Name, path)
	}
	if mount.SubPath != "" || mount.SubPathExpr != "" {
		return podFile{}, fmt.Errorf("container %s: %s: subPath mounts are not modelled", c.Name, mount.MountPath)
	}
	rel := strings.TrimPrefix(path, strings.TrimSuffix(mount.MountPath, "/")+"/")
	vol := volume(spec, mount.Name)
	if vol == nil {
		return podFile{}, fmt.Errorf("container %s mounts %q, which no volume defines", c.Name, mount.Name)
	}
	var fsGroup *int64
	if spec.SecurityContext != nil {
		fsGroup = spec.SecurityContext.FSGroup
	}
	switch {
	case vol.Secret != nil:
		s := vol.Secret
		mode := corev1.SecretVolumeSourceDefaultMode
		if s.DefaultMode != nil {
			mode = *s.DefaultMode
		}
		found := len(s.Items) == 0 // without items, every key is a file of its name
		for _, it := range s.Items {
			if it.Path == rel {
				found = true
				if it.Mode != nil {
					mode = *it.Mode
				}
			}
		}
		if !found {
			return podFile{}, fmt.Errorf("secret volume %s projects no %s", vol.Name, rel)
		}
		f := podFile{uid: 0, gid: 0, mode: os.FileMode(mode) & 0o777, how: fmt.Sprintf("%s from Secret %s (volume %s)", path, s.SecretName, vol.Name)}
		if fsGroup != nil {
			f.gid, f.mode = *fsGroup, f.mode|0o440
		}
		return f, nil
	case vol.EmptyDir != nil:
		for i := range spec.InitContainers {
			ic := &spec.InitContainers[i]
			for _, m := range ic.VolumeMounts {
				if m.Name != vol.Name || m.ReadOnly {
					continue
				}
				dst := strings.TrimSuffix(m.MountPath, "/") + "/" + rel
				script := slices.Concat(ic.Command, ic.Args)
				if len(script) != 3 || script[0] != "/bin/sh" || script[1] != "-c" {
					continue
				}
				sm := copyScript.FindStringSubmatch(script[2])
				if sm == nil || sm[1] != dst || sm[4] != dst {
					continue
				}
				src, err := fileAt(spec, ic, sm[3])
				if err != nil {
					return podFile{}, fmt.Errorf("init container %s copies %s: %w", ic.Name, sm[3], err)
				}
				if !readable(spec, ic, src) {
					return podFile{}, fmt.Errorf("init container %s cannot read %s", ic.Name, src)
				}
				umask, _ := strconv.ParseUint(sm[2], 8, 32)
				uid, gid, _ := effectiveUser(spec, ic)
				if fsGroup != nil {
					gid = *fsGroup // the emptyDir is setgid fsGroup
				}
				return podFile{uid: uid, gid: gid, mode: os.FileMode(0o666 &^ umask), how: fmt.Sprintf("%s copied by init container %s from %s", path, ic.Name, src.how)}, nil
			}
		}
		return podFile{}, fmt.Errorf("emptyDir %s: no init container writes %s", vol.Name, rel)
	}
	return podFile{}, fmt.Errorf("volume %s: only secret and emptyDir volumes are modelled", vol.Name)
}

// readable reports whether container c may read f: as its owner, through one
// of its groups (its gid, the pod's fsGroup and supplemental groups), or as
// anyone.
func readable(spec *corev1.PodSpec, c *corev1.Container, f podFile) bool {
	uid, gid, _ := effectiveUser(spec, c)
	switch {
	case uid == 0:
		return true
	case uid == f.uid:
		return f.mode&0o400 != 0
	}
	groups := []int64{gid}
	if p := spec.SecurityContext; p != nil {
		if p.FSGroup != nil {
			groups = append(groups, *p.FSGroup)
		}
		groups = append(groups, p.SupplementalGroups...)
	}
	if slices.Contains(groups, f.gid) {
		return f.mode&0o040 != 0
	}
	return f.mode&0o004 != 0
}

// credsProblem says why the launcher of a pod could not use its --nats-creds
// file, nil when it can: the file must be readable by the launcher's user and
// pass the launcher's own check (bootstrap/natsconn/creds.Read: nothing for group or
// others), run here on a file of the modelled mode.
func credsProblem(t *testing.T, spec *corev1.PodSpec) error {
	t.Helper()
	c := container(spec, "launcher")
	path := flagValue(c.Args, "--nats-creds")
	if path == "" {
		return errors.New("no --nats-creds")
	}
	f, err := fileAt(spec, c, path)
	if err != nil {
		return err
	}
	if !readable(spec, c, f) {
		uid, _, _ := effectiveUser(spec, c)
		return fmt.Errorf("the launcher (uid %s) cannot read %s", idStr(uid), f)
	}
	tmp := filepath.Join(t.TempDir(), "creds")
	if err := os.WriteFile(tmp, creds.Credentials{User: "job-x", Password: "p"}.Marshal(), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(tmp, f.mode); err != nil {
		t.Fatal(err)
	}
	if _, err := creds.Read(tmp); err != nil {
		return fmt.Errorf("the launcher refuses %s: %w", f, err)
	}
	return nil
}

// TestCredentials checks that every job's launcher can read the files its
// flags name and accepts its credentials file, following how Kubernetes
// writes secret volumes (see fileAt). The subtests "secret mounted ..." show
// the clash the init container resolves: mounted straight into the launcher,
// the Secret is root's and unreadable (no fsGroup) or group-readable, which
// the launcher refuses (fsGroup).
func TestCredentials(t *testing.T) {
	for _, f := range manifests(t, "k8s/job-*.yaml") {
		t.Run(f, func(t *testing.T) {
			job := one[*batchv1.Job](t, load(t, f))
			spec := &job.Spec.Template.Spec
			if err := credsProblem(t, spec); err != nil {
				t.Fatal(err)
			}
			c := container(spec, "launcher")
			_, gid := imageUser(t, dockerfileOf(c.Image))
			cf, _ := fileAt(spec, c, flagValue(c.Args, "--nats-creds"))
			if uid, _, _ := effectiveUser(spec, c); cf.uid != uid || cf.mode&0o077 != 0 {
				t.Errorf("credentials %s: want the launcher's own (uid %d), owner-only", cf, uid)
			}
			t.Logf("credentials: %s", cf)
			ca, err := fileAt(spec, c, flagValue(c.Args, "--nats-ca"))
			if err != nil || !readable(spec, c, ca) {
				t.Errorf("--nats-ca: the launcher cannot read %s (%v)", ca, err)
			}
			secret := credsSecretVolume(t, spec)
			if slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == secret.Name }) {
				t.Errorf("the launcher mounts the credentials Secret %s itself: it would see the group-readable file", secret.Secret.SecretName)
			}

			// The configurations that cannot work, modelled alike.
			for _, tc := range []struct {
				name    string
				fsGroup *int64
				want    string
			}{
				{"secret mounted in the launcher, no fsGroup", nil, "cannot read"},
				{"secret mounted in the launcher, fsGroup", ptrTo(gid), "want 0600"},
			} {
				t.Run(tc.name, func(t *testing.T) {
					bad := spec.DeepCopy()
					if bad.SecurityContext == nil {
						bad.SecurityContext = &corev1.PodSecurityContext{}
					}
					bad.SecurityContext.FSGroup = tc.fsGroup
					bad.InitContainers = nil
					l := container(bad, "launcher")
					dir := filepath.Dir(flagValue(l.Args, "--nats-creds"))
					for i, m := range l.VolumeMounts {
						if m.MountPath == dir {
							l.VolumeMounts[i].Name = secret.Name
						}
					}
					v := volume(bad, secret.Name)
					mode := int32(0o400)
					v.Secret.DefaultMode = &mode
					err := credsProblem(t, bad)
					if err == nil || !strings.Contains(err.Error(), tc.want) {
						t.Fatalf("got %v, want an error with %q", err, tc.want)
					}
					t.Log(err)
				})
			}
		})
	}
}

func ptrTo[T any](v T) *T { return &v }

// credsSecretVolume is the volume of the job's credentials Secret.
func credsSecretVolume(t *testing.T, spec *corev1.PodSpec) *corev1.Volume {
	t.Helper()
	for i, v := range spec.Volumes {
		if v.Secret != nil && strings.HasSuffix(v.Secret.SecretName, "-creds") {
			return &spec.Volumes[i]
		}
	}
	t.Fatal("no volume of a *-creds Secret")
	return nil
}

// TestImageUser checks that both images run as a numeric non-root user, so
// that Kubernetes' runAsNonRoot can verify it, and the same one.
func TestImageUser(t *testing.T) {
	u1, g1 := imageUser(t, "Dockerfile")
	u2, g2 := imageUser(t, "Dockerfile.cuda")
	if u1 == 0 || g1 == 0 || u1 != u2 || g1 != g2 {
		t.Errorf("Dockerfile runs as %d:%d, Dockerfile.cuda as %d:%d: want one non-root uid:gid", u1, g1, u2, g2)
	}
}
