package repl_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// The shipped Grafana dashboard and Prometheus alert rules must not go
// stale: every vmsan_* metric they query, and every label value they
// match literally (state="Connected", reason="split_brain"), must appear
// in the /metrics of a running replicated pair, and promtool must accept
// the rules and every dashboard query.

var (
	metricRe  = regexp.MustCompile(`\b(vmsan_[a-z0-9_]+)(\{[^}]*\})?`)
	matcherRe = regexp.MustCompile(`(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"`)
	sampleRe  = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? `)
	labelRe   = regexp.MustCompile(`(\w+)="((?:[^"\\]|\\.)*)"`)
	wordsRe   = regexp.MustCompile(`^[A-Za-z0-9_]+(\|[A-Za-z0-9_]+)*$`)
)

// alertExprs returns the expressions of docs/prometheus-alerts.yaml.
func alertExprs(t *testing.T, path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Expr        string            `yaml:"expr"`
				For         string            `yaml:"for"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var out []string
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" || r.Expr == "" || r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("%s: rule %q lacks alert, expr, severity or summary", path, r.Alert)
			}
			out = append(out, r.Expr)
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s: no rules", path)
	}
	return out
}

// dashboardExprs returns the queries of docs/grafana-dashboard.json
// (panel targets and template variables).
func dashboardExprs(t *testing.T, path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Title  string `json:"title"`
		UID    string `json:"uid"`
		Panels []struct {
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if d.Title == "" || d.UID == "" || len(d.Panels) == 0 {
		t.Fatalf("%s: no title, uid or panels", path)
	}
	var out []string
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("%s: panel %q has no query", path, p.Title)
		}
		for _, tg := range p.Targets {
			out = append(out, tg.Expr)
		}
	}
	lv := regexp.MustCompile(`^label_values\((.*),\s*\w+\)$`)
	for _, v := range d.Templating.List {
		if q, ok := v.Query.(map[string]any); ok {
			if m := lv.FindStringSubmatch(fmt.Sprint(q["query"])); m != nil {
				out = append(out, m[1])
			}
		}
	}
	// Grafana's variables, as Prometheus would see them.
	r := strings.NewReplacer("$__rate_interval", "5m", "$instance", ".*", "$volume", ".*")
	for i := range out {
		out[i] = r.Replace(out[i])
	}
	return out
}

// scraped indexes /metrics: sample name -> label name -> values seen.
func scraped(text string) map[string]map[string]map[string]bool {
	m := map[string]map[string]map[string]bool{}
	for _, line := range strings.Split(text, "\n") {
		s := sampleRe.FindStringSubmatch(line)
		if s == nil || strings.HasPrefix(line, "#") {
			continue
		}
		if m[s[1]] == nil {
			m[s[1]] = map[string]map[string]bool{}
		}
		for _, l := range labelRe.FindAllStringSubmatch(s[3], -1) {
			if m[s[1]][l[1]] == nil {
				m[s[1]][l[1]] = map[string]bool{}
			}
			m[s[1]][l[1]][l[2]] = true
		}
	}
	return m
}

func TestDashboardAndAlertsMatchMetrics(t *testing.T) {
	need(t, "promtool")
	docs := filepath.Join("..", "..", "docs")
	alerts := filepath.Join(docs, "prometheus-alerts.yaml")
	exprs := map[string][]string{
		alerts: alertExprs(t, alerts),
		filepath.Join(docs, "grafana-dashboard.json"): dashboardExprs(t, filepath.Join(docs, "grafana-dashboard.json")),
	}
	if out, err := exec.Command("promtool", "check", "rules", alerts).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules %s: %v\n%s", alerts, err, out)
	}
	// The dashboard's queries, checked by promtool as recording rules.
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, e := range exprs[filepath.Join(docs, "grafana-dashboard.json")] {
		q, _ := json.Marshal(e) // a JSON string is a YAML string
		fmt.Fprintf(&rules, "      - record: dashboard_query_%d\n        expr: %s\n", i, q)
	}
	rf := filepath.Join(t.TempDir(), "dashboard-rules.yaml")
	os.WriteFile(rf, []byte(rules.String()), 0o644)
	if out, err := exec.Command("promtool", "check", "rules", rf).CombinedOutput(); err != nil {
		t.Errorf("promtool rejects a dashboard query: %v\n%s", err, out)
	}

	p := newPair(t, pairOpts{})
	mustIO(t, p.a.uri(), writes(0x31, 0, 64<<10, 64<<10, 4)...)
	have := scraped(p.a.scrape())
	for file, es := range exprs {
		for _, e := range es {
			for _, sel := range metricRe.FindAllStringSubmatch(e, -1) {
				name := sel[1]
				labels, ok := have[name]
				if !ok {
					t.Errorf("%s: metric %s is not exported (query %q)", file, name, e)
					continue
				}
				for _, mt := range matcherRe.FindAllStringSubmatch(sel[2], -1) {
					lname, op, val := mt[1], mt[2], mt[3]
					if lname == "instance" || lname == "job" {
						continue // target labels: Prometheus adds them at scrape time
					}
					if labels[lname] == nil {
						t.Errorf("%s: %s has no label %q (query %q)", file, name, lname, e)
						continue
					}
					if (op != "=" && op != "=~") || !wordsRe.MatchString(val) {
						continue // a pattern or a variable: nothing literal to check
					}
					for _, v := range strings.Split(val, "|") {
						if !labels[lname][v] {
							t.Errorf("%s: %s{%s=%q} is never exported (query %q)", file, name, lname, v, e)
						}
					}
				}
			}
		}
	}
}
