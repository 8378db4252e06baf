package api

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Page sizes of the list routes.
const (
	DefaultPageLimit = 100
	MaxPageLimit     = 1000
)

// NextTokenHeader carries the next page's token ("": the last page).
const NextTokenHeader = "X-Next-Token"

// limitOf reads the limit query parameter.
func limitOf(q url.Values) (int, error) {
	v := q.Get("limit")
	if v == "" {
		return DefaultPageLimit, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > MaxPageLimit {
		return 0, invalid("query parameter \"limit\": %q is not a number in 1..%d", v, MaxPageLimit)
	}
	return n, nil
}

// metadataFilter reads `metadata=k1%3Dv1%26k2%3Dv2` (E2B's form; also
// repeated `metadata=k=v`).
func metadataFilter(q url.Values) (map[string]string, error) {
	out := map[string]string{}
	for _, raw := range q["metadata"] {
		kv, err := url.ParseQuery(raw)
		if err != nil {
			return nil, invalid("query parameter \"metadata\": %q is not key=value pairs joined by &: %v", raw, err)
		}
		for k, vs := range kv {
			if k == "" {
				return nil, invalid("query parameter \"metadata\": an empty key in %q", raw)
			}
			out[k] = vs[len(vs)-1]
		}
	}
	return out, nil
}

// stateFilter reads `state=running,paused` or repeated `state=`.
func stateFilter(q url.Values) (map[string]bool, error) {
	out := map[string]bool{}
	for _, raw := range q["state"] {
		for _, st := range strings.Split(raw, ",") {
			switch st {
			case "running", "paused", "stopped", "created", "unknown":
				out[st] = true
			default:
				return nil, invalid("query parameter \"state\": %q is not one of running, paused, stopped, created, unknown", st)
			}
		}
	}
	return out, nil
}

// sandboxToken is the position after sb.
func sandboxToken(sb Sandbox) string {
	return base64.RawURLEncoding.EncodeToString(fmt.Appendf(nil, "%d/%s", sb.StartedAt.UnixNano(), sb.SandboxID))
}

// parseSandboxToken reads a nextToken.
func parseSandboxToken(t string) (time.Time, string, error) {
	b, err := base64.RawURLEncoding.DecodeString(t)
	if err == nil {
		if ns, id, ok := strings.Cut(string(b), "/"); ok {
			if n, err := strconv.ParseInt(ns, 10, 64); err == nil && id != "" {
				return time.Unix(0, n), id, nil
			}
		}
	}
	return time.Time{}, "", invalid("query parameter \"nextToken\": %q is not a token this server returned", t)
}

// before orders sandboxes by start time, then id.
func before(a Sandbox, t time.Time, id string) bool {
	if !a.StartedAt.Equal(t) {
		return a.StartedAt.Before(t)
	}
	return a.SandboxID < id
}

// listSandboxes is GET /sandboxes and /v2/sandboxes: oldest first, filtered by
// metadata and state, paged with limit/nextToken (the next token in X-Next-Token).
func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	limit, err := limitOf(q)
	if err != nil {
		return err
	}
	md, err := metadataFilter(q)
	if err != nil {
		return err
	}
	states, err := stateFilter(q)
	if err != nil {
		return err
	}
	var afterT time.Time
	var afterID string
	if t := q.Get("nextToken"); t != "" {
		if afterT, afterID, err = parseSandboxToken(t); err != nil {
			return err
		}
	}
	cs, err := s.be.List(r.Context())
	if err != nil {
		return err
	}
	all := make([]Sandbox, 0, len(cs))
	for _, c := range cs {
		all = append(all, sandboxOf(c))
	}
	sort.Slice(all, func(i, j int) bool { return before(all[i], all[j].StartedAt, all[j].SandboxID) })
	out := []Sandbox{}
	next := ""
	for _, sb := range all {
		if afterID != "" && !before(Sandbox{StartedAt: afterT, SandboxID: afterID}, sb.StartedAt, sb.SandboxID) {
			continue
		}
		if len(states) > 0 && !states[sb.State] || !matches(sb.Metadata, md) {
			continue
		}
		if len(out) == limit {
			next = sandboxToken(out[len(out)-1])
			break
		}
		out = append(out, sb)
	}
	if next != "" {
		w.Header().Set(NextTokenHeader, next)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// matches says whether md has every pair of want.
func matches(md, want map[string]string) bool {
	for k, v := range want {
		if got, ok := md[k]; !ok || got != v {
			return false
		}
	}
	return true
}
