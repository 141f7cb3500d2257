package api

import "testing"

// A view without a layout routes by the arithmetic; a layout travels as runs
// and comes back as the same table; a bad one is an error, not a panic.
func TestViewTable(t *testing.T) {
	v := &ClusterView{Partitions: 64, Groups: 4}
	tab, err := ViewTable(v)
	if err != nil || tab.Epoch != 0 || tab.GroupOf(31) != GroupOf(31, 64, 4) {
		t.Fatalf("view without layout: %+v %v", tab, err)
	}
	if LayoutToProto(tab) != nil {
		t.Fatal("the arithmetic travels: want no layout field for epoch 0")
	}
	moved := tab.Move(31, 2)
	v.Layout = LayoutToProto(moved)
	back, err := ViewTable(v)
	if err != nil || !back.Equal(moved) || back.GroupOf(31) != 2 {
		t.Fatalf("round trip: %+v %v", back, err)
	}
	for name, pl := range map[string]*PartitionLayout{
		"unpaired runs": {Epoch: 1, Groups: 4, RunFirst: []uint32{0, 16}, RunGroup: []uint32{0}},
		"group too big": {Epoch: 1, Groups: 4, RunFirst: []uint32{0}, RunGroup: []uint32{4}},
		"no runs":       {Epoch: 1, Groups: 4},
	} {
		v.Layout = pl
		if _, err := ViewTable(v); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := ViewTable(&ClusterView{}); err == nil {
		t.Error("a view of 0 partitions accepted")
	}
}
