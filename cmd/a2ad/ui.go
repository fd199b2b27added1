package main

import (
	"embed"
	"encoding/json"
	"io/fs"
	"net/http"
	"time"

	"github.com/a2a-moe/a2a/a2a/control"
	"github.com/a2a-moe/a2a/metrics"
)

// uiFiles are the live view's static files: a page, a stylesheet and a
// script that polls /ui/api/groups and draws HTML tables, no framework.
//
//go:embed ui
var uiFiles embed.FS

// uiHandler serves the live view of the groups svc coordinates (serve's
// coordinators, merged): the page at /ui/ and its data at /ui/api/groups.
// tl, if not nil, is the history of svc's MoE layers that the MoE panel
// draws.
func uiHandler(svc metrics.TrafficSource, tl *moeTimeline) http.Handler {
	static, err := fs.Sub(uiFiles, "ui")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	mux := http.NewServeMux()
	mux.Handle("GET /ui/", http.StripPrefix("/ui/", http.FileServerFS(static)))
	mux.HandleFunc("GET /ui/api/groups", func(w http.ResponseWriter, r *http.Request) {
		// ?since=CURSOR, an earlier answer's moe_cursor: the MoE
		// history then holds only what was sampled after it, so that a
		// page polling every second does not fetch five minutes of a few
		// hundred experts each time.
		var since time.Time
		if v := r.URL.Query().Get("since"); v != "" {
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				http.Error(w, "since: want an earlier answer's moe_cursor (RFC 3339)", http.StatusBadRequest)
				return
			}
			since = t
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(uiSnapshot(svc, tl, time.Now(), since))
	})
	return mux
}

// uiState is the JSON of /ui/api/groups. Matrices are [from rank][to rank].
type uiState struct {
	Time time.Time `json:"time"`
	// MoECursor is the time of the newest MoE samples in the answer: pass
	// it as ?since= to get only newer ones.
	MoECursor time.Time `json:"moe_cursor"`
	Groups    []uiGroup `json:"groups"`
}

type uiGroup struct {
	Group         string     `json:"group"`
	Epoch         uint32     `json:"epoch"`
	Size          int        `json:"size"`
	Forming       bool       `json:"forming"`
	Aborted       bool       `json:"aborted"`
	PendingCounts int        `json:"pending_counts"`
	Hosts         []string   `json:"hosts"` // host identities in order of first appearance by rank
	Ranks         []uiRank   `json:"ranks"`
	Traffic       *uiTraffic `json:"traffic,omitempty"` // nil until a rank reported
	MoE           *uiMoE     `json:"moe,omitempty"`     // nil until a rank reported MoE figures (uimoe.go)
}

type uiRank struct {
	Rank int `json:"rank"` // -1: joining, not assigned yet
	Host int `json:"host"` // index in uiGroup.Hosts
	PID  int `json:"pid"`
	// State is alive, lost (silent past its peer timeout), left or joining.
	State string `json:"state"`
	// HeartbeatAge and ReportAge are seconds since the last heartbeat (join
	// refresh while forming) and traffic report (-1: none yet).
	HeartbeatAge float64 `json:"heartbeat_age_s"`
	ReportAge    float64 `json:"report_age_s"`
	Errors       uint64  `json:"errors"`
}

type uiTraffic struct {
	SentRate [][]float64 `json:"sent_rate"` // bytes/s lately
	Sent     [][]uint64  `json:"sent"`      // bytes since the group formed
	// LocalRate and Local are the class "local" of the same: bytes moved
	// through shared memory by the MoE dispatcher, outside the transport
	// (not in SentRate and Sent).
	LocalRate [][]float64 `json:"local_rate"`
	Local     [][]uint64  `json:"local"`
	WaitShare [][]float64 `json:"wait_share"` // part of the recent time spent waiting on the peer
	Wait      [][]float64 `json:"wait_s"`     // seconds waited since the group formed
	Last      [][]uint64  `json:"last"`       // operations in which the peer arrived last
	Ops       []uiOp      `json:"ops"`
}

type uiOp struct {
	Op    string `json:"op"`
	Algo  string `json:"algo"`
	Calls uint64 `json:"calls"`
}

// uiSnapshot gathers the membership, traffic and MoE layer of every group
// at now, with the MoE history after since (all of it if since is zero).
func uiSnapshot(svc metrics.TrafficSource, tl *moeTimeline, now, since time.Time) uiState {
	st := uiState{Time: now, MoECursor: tl.cursor(), Groups: []uiGroup{}}
	for _, g := range svc.Groups() {
		ug := uiGroup{Group: g.Group, Epoch: g.Epoch, Size: g.Size, Forming: g.Forming, Aborted: g.Aborted,
			PendingCounts: g.PendingCounts, Hosts: []string{}, Ranks: []uiRank{}}
		tv, haveTraffic := svc.Traffic(g.Group)
		haveTraffic = haveTraffic && !g.Forming && tv.Epoch == g.Epoch && tv.Size == len(g.Ranks)
		hostIndex := map[string]int{}
		for _, r := range g.Ranks {
			h, ok := hostIndex[r.Host]
			if !ok {
				h = len(ug.Hosts)
				hostIndex[r.Host] = h
				ug.Hosts = append(ug.Hosts, r.Host)
			}
			ur := uiRank{Rank: r.Rank, Host: h, PID: r.PID, State: "alive", ReportAge: -1,
				HeartbeatAge: now.Sub(r.LastHeartbeat).Seconds()}
			switch {
			case g.Forming:
				ur.State = "joining"
			case r.Left:
				ur.State = "left"
			case r.Lost:
				ur.State = "lost"
			}
			if haveTraffic {
				if rt := tv.Ranks[r.Rank]; !rt.Reported.IsZero() {
					ur.ReportAge, ur.Errors = now.Sub(rt.Reported).Seconds(), rt.Errors
				}
			}
			ug.Ranks = append(ug.Ranks, ur)
		}
		if haveTraffic {
			ug.Traffic = uiTrafficOf(tv)
			ug.MoE = tl.view(tv, now, since, st.MoECursor)
		}
		st.Groups = append(st.Groups, ug)
	}
	return st
}

func uiTrafficOf(tv control.TrafficView) *uiTraffic {
	t := &uiTraffic{Ops: []uiOp{}}
	for _, rt := range tv.Ranks {
		wait := make([]float64, len(rt.Wait))
		for j, w := range rt.Wait {
			wait[j] = w.Seconds()
		}
		t.SentRate = append(t.SentRate, rt.SentRate)
		t.Sent = append(t.Sent, rt.Sent)
		t.LocalRate = append(t.LocalRate, rt.LocalRate)
		t.Local = append(t.Local, rt.Local)
		t.WaitShare = append(t.WaitShare, rt.WaitShare)
		t.Wait = append(t.Wait, wait)
		t.Last = append(t.Last, rt.Last)
	}
	for _, o := range tv.Ops {
		t.Ops = append(t.Ops, uiOp{Op: o.Op, Algo: o.Algo, Calls: o.Calls})
	}
	return t
}
