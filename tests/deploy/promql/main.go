// Command promql parses every PromQL expression of a Grafana dashboard with Prometheus's own
// parser, Grafana's variables replaced by values of the same type, so a query that Grafana
// would show as a panel error fails the build instead. tests/deploy/run.sh runs it:
//
//	go run . ../../../deploy/grafana/sluice.json
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/prometheus/prometheus/promql/parser"
)

type panel struct {
	Title   string  `json:"title"`
	Panels  []panel `json:"panels"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

// Grafana's variables as PromQL would see them once expanded.
var variables = strings.NewReplacer(
	"$__rate_interval", "1m",
	"$__interval", "1m",
	"$__range", "1h",
	"$namespace", ".*",
	"$instance", ".*",
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: promql DASHBOARD.json")
		os.Exit(2)
	}
	raw, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var dashboard struct {
		Panels []panel `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dashboard); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
	p := parser.NewParser(parser.Options{})
	checked, failed := 0, 0
	var walk func([]panel)
	walk = func(panels []panel) {
		for _, pn := range panels {
			walk(pn.Panels)
			for _, t := range pn.Targets {
				checked++
				expr := variables.Replace(t.Expr)
				if strings.Contains(expr, "$") {
					failed++
					fmt.Fprintf(os.Stderr, "%q: unknown variable in %s\n", pn.Title, t.Expr)
				} else if _, err := p.ParseExpr(expr); err != nil {
					failed++
					fmt.Fprintf(os.Stderr, "%q: %v\n  %s\n", pn.Title, err, t.Expr)
				}
			}
		}
	}
	walk(dashboard.Panels)
	fmt.Printf("%s: %d PromQL expressions, %d invalid\n", os.Args[1], checked, failed)
	if failed > 0 || checked == 0 {
		os.Exit(1)
	}
}
