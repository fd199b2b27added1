package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/control"
	"github.com/a2a-moe/a2a/internal/credsfile"
	"github.com/a2a-moe/a2a/internal/natsd"
)

// tenantServe starts a2ad serve on loopback with a credentials file of the
// test's, and returns its URL, that file and what serve printed.
func tenantServe(t *testing.T, args ...string) (url, creds, out string) {
	t.Helper()
	creds = filepath.Join(t.TempDir(), "serve.env")
	addr := freeAddr(t)
	out = startServe(t, []string{"A2A_SECRET=", "A2A_CREDS="}, false, append([]string{"--listen", addr, "--creds", creds}, args...)...)
	return "nats://" + addr, creds, out
}

// newJob runs `a2ad job new` for group and returns its job file.
func newJob(t *testing.T, ctx context.Context, url, creds, group string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), group+".env")
	if b, err := a2ad(t, ctx, "job", "new", "--nats", url, "--creds", creds, "--group", group, "--out", file).CombinedOutput(); err != nil {
		t.Fatalf("job new --group %s: %v\n%s", group, err, b)
	}
	return file
}

// demoJob runs a verified demo of n ranks with the job file.
func demoJob(t *testing.T, ctx context.Context, url, jobFile string, n, steps int) error {
	out, err := a2ad(t, ctx, "run", "-n", strconv.Itoa(n), "--bind", "none", "--nats", url, "--creds", jobFile, "--",
		a2adBin, "demo", "--worker", "--steps", strconv.Itoa(steps)).CombinedOutput()
	want := fmt.Sprintf("[rank 0] all %d steps verified on %d ranks", steps, n)
	if err != nil || !strings.Contains(string(out), want) {
		return fmt.Errorf("job %s: %v\n%s", filepath.Base(jobFile), err, out)
	}
	return nil
}

// TestTenantSpy: a rank of job B, with B's credentials, subscribes to ">"
// and to A's subjects and publishes forgeries on them while job A runs: the
// server refuses what lies outside B's account (">", the admin subject), A's
// subject names inside B's account are B's own and reach nothing of A, B
// sees none of A's messages, nor does a
// rank of job C (of any group) subscribed to a2a.> and _INBOX.> of its own
// account, and A's loop verifies, coordinated by serve with A's own secret. `a2ad run --nats`
// with serve's own file gives its ranks a job's login, never serve's.
func TestTenantSpy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	url, creds, out := tenantServe(t, "--metrics", "127.0.0.1:0")
	m := regexp.MustCompile(`metrics at http://(\S+)/metrics`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no metrics line:\n%s", out)
	}
	jobA, jobB := newJob(t, ctx, url, creds, "ga"), newJob(t, ctx, url, creds, "gb")
	a, err := credsfile.Read(jobA)
	if err != nil {
		t.Fatal(err)
	}
	b, err := credsfile.Read(jobB)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := credsfile.Read(creds)
	if err != nil {
		t.Fatal(err)
	}
	if a["A2A_GROUP"] != "ga" || a["A2A_SECRET"] == "" || a["A2A_SECRET"] == b["A2A_SECRET"] || a["A2A_SECRET"] == admin["A2A_SECRET"] ||
		a["A2A_NATS_USER"] == admin["A2A_NATS_USER"] || a["A2A_NATS_PASSWORD"] == b["A2A_NATS_PASSWORD"] {
		t.Fatalf("job files do not hold credentials of their own: %q %q", a, b)
	}
	if again := newJob(t, ctx, url, creds, "ga"); !sameVars(t, again, jobA) {
		t.Error("asked again for group ga, serve minted other credentials: the hosts of one job would not agree")
	}

	violations := make(chan error, 64)
	// NoEcho: the spy's own forgeries, published in its own account where
	// it may subscribe to a2a.>, are not what it is looking for.
	spy, err := nats.Connect(url, nats.UserInfo(b["A2A_NATS_USER"], b["A2A_NATS_PASSWORD"]), nats.MaxReconnects(0), nats.NoEcho(),
		nats.CustomInboxPrefix(control.InboxPrefix("gb")),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { violations <- err }))
	if err != nil {
		t.Fatal(err)
	}
	defer spy.Close()
	var seen atomic.Int64
	var lastSeen atomic.Value
	for _, subj := range append([]string{">", "a2a.>", "_INBOX.>", "a2a.ga.*", "a2a.svc.ga.*", "_INBOX.ga.>", adminJobNew}, control.Subjects("gb")...) {
		if _, err := spy.Subscribe(subj, func(m *nats.Msg) { seen.Add(1); lastSeen.Store(m.Subject) }); err != nil {
			t.Fatal(err)
		}
	}
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}
	// A job of any group (no --group) may use a2a.> and _INBOX.>, of its
	// own account: it sees nothing of A's either.
	jobC := filepath.Join(t.TempDir(), "c.env")
	if b, err := a2ad(t, ctx, "job", "new", "--nats", url, "--creds", creds, "--out", jobC).CombinedOutput(); err != nil {
		t.Fatalf("job new: %v\n%s", err, b)
	}
	c, err := credsfile.Read(jobC)
	if err != nil || c["A2A_GROUP"] != "" || c["A2AD_JOB"] == "" || c["A2AD_JOB"] == a["A2AD_JOB"] {
		t.Fatalf("a job of any group: %q %v", c, err)
	}
	wide, err := nats.Connect(url, nats.UserInfo(c["A2A_NATS_USER"], c["A2A_NATS_PASSWORD"]), nats.MaxReconnects(0),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { t.Errorf("C's spy: %v", err) }))
	if err != nil {
		t.Fatal(err)
	}
	defer wide.Close()
	for _, subj := range []string{"a2a.>", "_INBOX.>"} {
		if _, err := wide.Subscribe(subj, func(m *nats.Msg) { seen.Add(1); lastSeen.Store("C: " + m.Subject) }); err != nil {
			t.Fatal(err)
		}
	}
	if err := wide.Flush(); err != nil {
		t.Fatal(err)
	}
	var forged atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { // forgeries on A's subjects all the time A runs
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			for _, subj := range []string{"a2a.ga.abort", "a2a.ga.hb", "a2a.svc.ga.counts", "a2a.svc.ga.join", adminJobNew} {
				if spy.Publish(subj, []byte("forged")) == nil {
					forged.Add(1)
				}
			}
		}
	})
	var running sync.WaitGroup
	running.Go(func() { err = demoJob(t, ctx, url, jobA, 3, 100) })
	viewed := watchGroups(ctx, "http://"+m[1]+"/ui/api/groups", &running)
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if !viewed["ga"] {
		t.Errorf("serve's live view never showed group ga: its coordinator was not serve's (it showed %v)", viewed)
	}
	_ = spy.Flush()
	if n := seen.Load(); n != 0 {
		t.Errorf("B's spy saw %d messages (the last on %v) while A ran", n, lastSeen.Load())
	}
	refused := map[string]bool{}
	for len(violations) > 0 {
		err := <-violations
		if !errors.Is(err, nats.ErrPermissionViolation) {
			t.Errorf("spy: %v, want permission violations", err)
		}
		refused[strings.Split(err.Error(), `"`)[1]] = true
	}
	// Within its account B may use every a2a subject, A's names included:
	// they are B's own subjects there. What lies outside is refused.
	for _, subj := range []string{">", adminJobNew} {
		if !refused[subj] {
			t.Errorf("the server did not refuse B's spy %q (refused: %v)", subj, refused)
		}
	}
	if forged.Load() == 0 {
		t.Error("the spy published nothing")
	}

	// a2ad run --nats with serve's file: the ranks get a job's login.
	out2, err := a2ad(t, ctx, "run", "-n", "1", "--nats", url, "--creds", creds, "--group", "gc", "--",
		"sh", "-c", `echo "user=$A2A_NATS_USER group=$A2A_GROUP creds=$A2A_CREDS"`).CombinedOutput()
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out2)
	}
	if m := regexp.MustCompile(`user=(\S*) group=gc creds=\n`).FindSubmatch(out2); m == nil || string(m[1]) == admin["A2A_NATS_USER"] || string(m[1]) == "" {
		t.Errorf("the ranks of run --nats with serve's file got %q, want a job's user, group gc, no A2A_CREDS", out2)
	}
	// ... and its --secret is refused: serve mints the job's.
	if out, err := a2ad(t, ctx, "run", "-n", "1", "--nats", url, "--creds", creds, "--secret", "x", "--", "true").CombinedOutput(); err == nil {
		t.Errorf("run --nats with serve's file and --secret: %s", out)
	}
	// A job file is for its group only.
	if out, err := a2ad(t, ctx, "run", "-n", "1", "--nats", url, "--creds", jobA, "--group", "gb", "--", "true").CombinedOutput(); err == nil {
		t.Errorf("run with A's file as group gb: %s", out)
	}
	// A job file is no admin's.
	if out, err := a2ad(t, ctx, "job", "new", "--nats", url, "--creds", jobB).CombinedOutput(); err == nil {
		t.Errorf("job new with a job file: %s", out)
	}
	// Serve's file, not a job's, is the admin's: a wrong one is ErrAuth.
	bad := filepath.Join(t.TempDir(), "bad.env")
	if err := credsfile.Write(bad, nil, []credsfile.Var{{Key: "A2A_NATS_USER", Value: admin["A2A_NATS_USER"]},
		{Key: "A2A_NATS_PASSWORD", Value: "wrong"}}, false); err != nil {
		t.Fatal(err)
	}
	badVars, _ := credsfile.Read(bad)
	if _, err := mintJob(ctx, url, badVars, ""); !errors.Is(err, a2a.ErrAuth) {
		t.Errorf("mint with a wrong password: %v, want ErrAuth", err)
	}
}

// sameVars reports whether two credentials files hold the same variables.
func sameVars(t *testing.T, p, q string) bool {
	t.Helper()
	a, err := credsfile.Read(p)
	if err != nil {
		t.Fatal(err)
	}
	b, err := credsfile.Read(q)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprint(a) == fmt.Sprint(b)
}

// TestTenantsFlood: 10 jobs with credentials of their own on one serve,
// one of them flooding its coordinator and its group's subjects; the nine
// others verify, and serve's /metrics shows the flood dropped over the
// job's rate and every job's group.
func TestTenantsFlood(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	url, creds, out := tenantServe(t, "--metrics", "127.0.0.1:0", "--job-rate", "5000")
	m := regexp.MustCompile(`metrics at (\S+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no metrics line:\n%s", out)
	}
	admin, err := credsfile.Read(creds)
	if err != nil {
		t.Fatal(err)
	}
	files := make([]string, 10)
	for i := range files {
		job, err := mintJob(ctx, url, admin, fmt.Sprintf("t%d", i))
		if err != nil {
			t.Fatal(err)
		}
		files[i] = filepath.Join(t.TempDir(), "job.env")
		if err := credsfile.Write(files[i], nil, jobVars(job, admin), false); err != nil {
			t.Fatal(err)
		}
	}
	flood, err := credsfile.Read(files[0])
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(url, nats.UserInfo(flood["A2A_NATS_USER"], flood["A2A_NATS_PASSWORD"]), nats.MaxReconnects(0),
		nats.CustomInboxPrefix(control.InboxPrefix("t0")))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	stop := make(chan struct{})
	var flooded atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		junk := make([]byte, 256)
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, subj := range []string{"a2a.svc.t0.counts", "a2a.svc.t0.join", "a2a.t0.hb"} {
				if nc.Publish(subj, junk) != nil {
					return
				}
			}
			if flooded.Add(3)%3000 == 0 {
				_ = nc.Flush() // keep pace with the server rather than buffer
			}
		}
	})
	time.Sleep(200 * time.Millisecond) // the flood is on before the jobs start
	start := time.Now()
	errs := make(chan error, len(files)-1)
	var jobs sync.WaitGroup
	for _, f := range files[1:] {
		jobs.Go(func() { errs <- demoJob(t, ctx, url, f, 2, 100) })
	}
	viewed := watchGroups(ctx, strings.Replace(m[1], "/metrics", "/ui/api/groups", 1), &jobs)
	took := time.Since(start)
	close(errs)
	for i := 1; i < len(files); i++ {
		if g := fmt.Sprintf("t%d", i); !viewed[g] {
			t.Errorf("serve's live view never showed job %s (it showed %v)", g, viewed)
		}
	}
	metrics := get(t, m[1])
	close(stop)
	wg.Wait()
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	t.Logf("9 jobs in %v beside a flood of %d messages", took.Round(time.Millisecond), flooded.Load())
	rate := regexp.MustCompile(`a2a_control_rejected_messages_total\{reason="rate"\} (\S+)`).FindStringSubmatch(metrics)
	if rate == nil || rate[1] == "0" {
		t.Errorf("no message dropped over the flooding job's rate:\n%s", grepLines(metrics, "a2a_control_rejected"))
	}
}

// watchGroups polls serve's live view (api: its /ui/api/groups) until
// running is done, and returns every formed group it showed.
func watchGroups(ctx context.Context, api string, running *sync.WaitGroup) map[string]bool {
	done := make(chan struct{})
	go func() { running.Wait(); close(done) }()
	seen := map[string]bool{}
	re := regexp.MustCompile(`"group":"([^"]+)","epoch":[1-9]`)
	for {
		select {
		case <-done:
			return seen
		case <-ctx.Done():
			return seen
		case <-time.After(10 * time.Millisecond):
		}
		resp, err := http.Get(api)
		if err != nil {
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, m := range re.FindAllSubmatch(b, -1) {
			seen[string(m[1])] = true
		}
	}
}

// get returns the body at url.
func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestTenancyReap: serve drops a job once no rank has been connected for
// jobIdle, and its login is refused from then on; a job with a rank
// connected stays, however long.
func TestTenancyReap(t *testing.T) {
	admin := natsd.NewUser("admin", []string{"a2a.>", "_INBOX.>", adminJobNew})
	cp, err := startControlPlane(slog.New(slog.DiscardHandler), cpConfig{Listen: "127.0.0.1:0", Users: []natsd.User{admin},
		Jobs: &jobLimits{Conns: 4, Subs: 64}})
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Close()
	busy, err := cp.tenants.job("busy")
	if err != nil {
		t.Fatal(err)
	}
	idle, err := cp.tenants.job("")
	if err != nil {
		t.Fatal(err)
	}
	if again, err := cp.tenants.job("busy"); err != nil || again != busy {
		t.Fatalf("job busy asked again: %v, %v", again, err)
	}
	if again, err := cp.tenants.job(""); err != nil || again == idle {
		t.Fatalf("a job of any group asked again: %v (the same one), %v", again, err)
	}
	if _, err := cp.tenants.job("a.b"); err == nil {
		t.Error("a job of group a.b, two subject tokens")
	}
	nc, err := nats.Connect(cp.URL, busy.ranks.Options()...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	now := time.Now()
	cp.tenants.reapIdle(now)
	cp.tenants.reapIdle(now.Add(jobIdle + time.Second))
	if nc, err := nats.Connect(cp.URL, idle.ranks.Options()...); err == nil {
		nc.Close()
		t.Error("the idle job's user logged in after it was dropped")
	}
	if n := len(cp.tenants.services()); n != 1 {
		t.Errorf("%d jobs after reaping, want busy alone", n)
	}
	if again, err := cp.tenants.job("busy"); err != nil || again != busy {
		t.Errorf("the busy job was dropped: %v, %v", again, err)
	}
}
