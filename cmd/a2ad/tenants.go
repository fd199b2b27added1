package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/a2a-moe/a2a/a2a/control"
	"github.com/a2a-moe/a2a/internal/natsd"
)

// Tenancy of a2ad serve: every job gets credentials of its own, minted on
// the request of serve's admin (the user of its credentials file) on
// adminJobNew. A job is a NATS account of its own on the embedded server
// (natsd.Tenants): its ranks' user and a connection of serve running the
// job's coordinator with the job's own secret. Accounts are separate
// subject spaces, so a job's ranks see and reach nothing of another job's,
// nor of serve's global account, where the admin and the jobs that share
// serve's file (one secret for all) are. A job minted for a group is pinned
// to it: every host that asks for the group gets the same job, and its
// ranks run that group by default; one minted without a group runs the
// groups its launchers name (mpirun's job id, ...). Either way the job's
// user may use every a2a subject and inbox of its own account, so a job
// may also form other groups there (a soak's sessions, say): the account,
// not the group, is what isolates it.

// adminJobNew is the subject on which serve's admin asks for a job's
// credentials. It lies outside a2a.>, so that the shared coordinator never
// takes a request for a message of a group named "admin"; only users of
// serve's global account (its credentials file) reach it.
const adminJobNew = "a2ad.admin.job.new"

// jobLimits bound what one job may take of serve.
type jobLimits struct {
	Conns int     // connections of its ranks at once
	Subs  int     // subscriptions of one connection
	Rate  float64 // messages per second its coordinator takes in
}

// jobIdle is how long a job's account stays without a rank connected
// before serve drops it (its credentials stop working): long enough for the
// hosts of a job started one by one, short enough that jobs run one after
// the other for days do not pile up.
const jobIdle = 10 * time.Minute

// maxJobs is the most jobs serve holds at once: each costs an account, a
// connection and a coordinator.
const maxJobs = 1024

// jobRequest asks for the credentials of a job pinned to Group, or ("")
// of one that runs any group in its account.
type jobRequest struct {
	Group string `json:"group,omitempty"`
}

// jobReply is serve's answer: the job's credentials, or why not.
type jobReply struct {
	Job      string `json:"job,omitempty"` // its account's name
	Group    string `json:"group,omitempty"`
	User     string `json:"user,omitempty"`
	Password string `json:"password,omitempty"`
	Secret   string `json:"secret,omitempty"`
	Error    string `json:"error,omitempty"`
}

// tenancy is the jobs serve hosts in accounts of their own.
type tenancy struct {
	ts     *natsd.Tenants
	url    string // what in-process connections dial
	log    *slog.Logger
	limits jobLimits
	sub    *nats.Subscription
	stop   chan struct{}
	done   chan struct{}

	mu     sync.Mutex
	jobs   map[string]*tenant // by group when pinned, else by account
	next   int                // the number of the next account
	closed bool
}

// tenant is one job: its account, its ranks' credentials and its
// coordinator.
type tenant struct {
	group, account string
	ranks          natsd.User
	secret         string
	nc             *nats.Conn
	svc            *control.Service
	idleSince      time.Time // when it was last seen without a rank (zero: ranks connected)
}

// startTenancy answers the admin's requests for job credentials on admin, a
// connection of serve's global account.
func startTenancy(log *slog.Logger, ts *natsd.Tenants, url string, admin *nats.Conn, limits jobLimits) (*tenancy, error) {
	t := &tenancy{ts: ts, url: url, log: log, limits: limits, jobs: map[string]*tenant{},
		stop: make(chan struct{}), done: make(chan struct{})}
	sub, err := admin.Subscribe(adminJobNew, t.onJobNew)
	if err != nil {
		return nil, err
	}
	if err := admin.Flush(); err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	t.sub = sub
	go t.reap()
	return t, nil
}

// onJobNew answers a request for a job's credentials.
func (t *tenancy) onJobNew(msg *nats.Msg) {
	var req jobRequest
	var rep jobReply
	if err := json.Unmarshal(msg.Data, &req); err != nil {
		rep.Error = "malformed request: " + err.Error()
	} else if j, err := t.job(req.Group); err != nil {
		rep.Error = err.Error()
	} else {
		rep = jobReply{Job: j.account, Group: j.group, User: j.ranks.Name, Password: j.ranks.Password, Secret: j.secret}
	}
	b, _ := json.Marshal(rep)
	if err := msg.Respond(b); err != nil {
		t.log.Warn("a2ad: answering a request for job credentials", "err", err)
	}
}

// job returns the job pinned to group, made now unless it exists: the hosts
// of one job, each asking, get the same credentials. "" makes a new job of
// any group.
func (t *tenancy) job(group string) (*tenant, error) {
	if group != "" && !groupToken(group) {
		return nil, fmt.Errorf("group %q: one NATS subject token (no '.', '*', '>' or spaces), at most 64 bytes", group)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, errors.New("serve is shutting down")
	}
	if j := t.jobs[group]; j != nil && group != "" {
		return j, nil
	}
	if len(t.jobs) >= maxJobs {
		return nil, fmt.Errorf("serve holds %d jobs, its most: a job is dropped %v after its last rank left", maxJobs, jobIdle)
	}
	t.next++
	account := fmt.Sprintf("job-%d", t.next)
	allow := []string{"a2a.>", "_INBOX.>"} // any group, in the job's account
	j := &tenant{group: group, account: account, secret: natsd.RandomHex(32), idleSince: time.Now(),
		ranks: natsd.NewUser(account, allow)}
	svcUser := natsd.NewUser(account+"-svc", nil)
	// One connection more than the ranks': the coordinator's.
	acc := natsd.Account{Name: account, Users: []natsd.User{j.ranks, svcUser},
		Limits: natsd.Limits{Conns: t.limits.Conns + 1, Subs: t.limits.Subs}}
	if err := t.ts.AddAccount(acc); err != nil {
		return nil, err
	}
	var err error
	j.nc, err = nats.Connect(t.url, append(svcUser.Options(), nats.InProcessServer(t.ts.Server),
		nats.Name("a2ad coordinator of "+account), nats.MaxReconnects(-1))...)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		j.svc, err = control.StartService(ctx, j.nc, control.ServiceConfig{Secret: []byte(j.secret),
			Logger: t.log.With("job", account, "group", group), MaxRate: t.limits.Rate})
		cancel()
	}
	if err != nil {
		j.close()
		t.ts.RemoveAccount(account)
		return nil, fmt.Errorf("the coordinator of job %s: %w", account, err)
	}
	t.jobs[cmp.Or(group, account)] = j
	t.log.Info("a2ad: job credentials minted", "group", group, "account", account)
	return j, nil
}

// groupToken reports whether g can be a group: one NATS subject token, of a
// length an account's subjects can carry.
func groupToken(g string) bool {
	return g != "" && len(g) <= 64 && !strings.ContainsFunc(g, func(r rune) bool {
		return r == '.' || r == '*' || r == '>' || r <= ' ' || r == 0x7f
	})
}

// reap drops the jobs that had no rank connected for jobIdle.
func (t *tenancy) reap() {
	defer close(t.done)
	tick := time.NewTicker(jobIdle / 20)
	defer tick.Stop()
	for {
		select {
		case <-t.stop:
			return
		case now := <-tick.C:
			t.reapIdle(now)
		}
	}
}

func (t *tenancy) reapIdle(now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for key, j := range t.jobs {
		acc, err := t.ts.LookupAccount(j.account)
		if err != nil || acc.NumConnections() > 1 { // the coordinator's is one
			j.idleSince = time.Time{}
			continue
		}
		if j.idleSince.IsZero() {
			j.idleSince = now
		}
		if now.Sub(j.idleSince) < jobIdle {
			continue
		}
		j.close()
		t.ts.RemoveAccount(j.account)
		delete(t.jobs, key)
		t.log.Info("a2ad: idle job dropped", "account", j.account, "group", j.group)
	}
}

func (j *tenant) close() {
	if j.svc != nil {
		_ = j.svc.Close()
	}
	if j.nc != nil {
		j.nc.Close()
	}
}

// close stops answering and every job's coordinator.
func (t *tenancy) close() {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	t.closed = true
	jobs := t.jobs
	t.mu.Unlock()
	close(t.stop)
	<-t.done
	_ = t.sub.Unsubscribe()
	for _, j := range jobs {
		j.close()
	}
}

// services are the coordinators of every job.
func (t *tenancy) services() []*control.Service {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*control.Service, 0, len(t.jobs))
	for _, j := range t.jobs {
		out = append(out, j.svc)
	}
	return out
}

// serveView is what serve's /metrics and /ui/ show: the groups of its
// shared coordinator and of every job's, merged.
type serveView struct {
	shared  *control.Service
	tenants *tenancy // nil without tenancy
}

func (v serveView) all() []*control.Service {
	return append([]*control.Service{v.shared}, v.tenants.services()...)
}

// Groups returns the groups of every coordinator, sorted by name.
func (v serveView) Groups() []control.GroupView {
	var out []control.GroupView
	for _, s := range v.all() {
		out = append(out, s.Groups()...)
	}
	slices.SortStableFunc(out, func(a, b control.GroupView) int { return cmp.Compare(a.Group, b.Group) })
	return out
}

// Traffic returns group's traffic from the coordinator that has it.
func (v serveView) Traffic(group string) (control.TrafficView, bool) {
	for _, s := range v.all() {
		if tv, ok := s.Traffic(group); ok {
			return tv, true
		}
	}
	return control.TrafficView{}, false
}

// Rejects sums the messages every coordinator refused.
func (v serveView) Rejects() control.Rejects {
	var r control.Rejects
	for _, s := range v.all() {
		for i, n := range s.Rejects() {
			r[i] += n
		}
	}
	return r
}
