package shared

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"

	pluginv1 "github.com/switchyard-router/switchyard/shared/pluginproto/switchyard/plugin/v1"
)

// BenchmarkDecodeLabels measures the plugin side's decoding of one task's
// 64 candidate rows (proto.Unmarshal of the DecideTask, then
// candidatesFromProto into reused Candidates), with the LABELS columns
// (names and four labels a row) and without: what declaring LABELS costs a
// plugin per decision beyond the router's side.
//
//	go test -run='^$' -bench=DecodeLabels -benchmem ./shared/ (from shared/: go test -bench=DecodeLabels -benchmem .)
func BenchmarkDecodeLabels(b *testing.B) {
	for _, with := range []bool{false, true} {
		cols := &pluginv1.Columns{}
		for i := range 64 {
			cols.Ids = append(cols.Ids, uint64(1000+i))
			cols.ActiveRequests = append(cols.ActiveRequests, int64(i%7))
			cols.OverlapBlocks = append(cols.OverlapBlocks, int32(i%9))
			if with {
				cols.Names = append(cols.Names, fmt.Sprintf("gpu-%d", i))
				l := WorkerLabels(map[string]string{"zone": fmt.Sprint("z", i%4), "rack": fmt.Sprint("r", i%16)}, RoleAggregated, []string{"llama"}, false, 0)
				cols.LabelCounts = append(cols.LabelCounts, uint32(len(l)))
				for _, p := range l {
					cols.LabelRefs = append(cols.LabelRefs, intern(&cols.LabelStrings, p.Key), intern(&cols.LabelStrings, p.Value))
				}
			}
		}
		raw, err := proto.Marshal(&pluginv1.DecideTask{TaskId: 1, Candidates: cols, Request: &pluginv1.Request{Id: "r"}})
		if err != nil {
			b.Fatal(err)
		}
		name := "none"
		if with {
			name = "labels"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			var c Candidates
			var store []Label
			for b.Loop() {
				var t pluginv1.DecideTask
				if err := proto.Unmarshal(raw, &t); err != nil {
					b.Fatal(err)
				}
				if err := candidatesFromProto(t.GetCandidates(), &c, &store); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(raw)), "wire-bytes")
		})
	}
}

// intern returns s's index in *strs, appending it when absent (the
// router's dedup, linearly: a benchmark's few strings).
func intern(strs *[]string, s string) uint32 {
	for i, x := range *strs {
		if x == s {
			return uint32(i)
		}
	}
	*strs = append(*strs, s)
	return uint32(len(*strs) - 1)
}
