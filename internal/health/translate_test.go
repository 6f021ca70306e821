package health

import (
	"slices"
	"testing"
)

func TestTranslate(t *testing.T) {
	const gpu0, gpu1 = "GPU-0", "GPU-1"
	byParent := map[string][]placement{
		gpu0: {{uuid: gpu0, gi: noInstance, ci: noInstance}},
		gpu1: {{uuid: "MIG-a", gi: 1, ci: 0}, {uuid: "MIG-b", gi: 2, ci: 0}},
	}
	tests := []struct {
		name string
		e    nvmlEvent
		want []observation
	}{
		{"xid on a whole GPU", nvmlEvent{gpuUUID: gpu0, eventType: nvmlEventXIDCritical, data: 79, gi: noInstance, ci: noInstance},
			[]observation{{uuid: gpu0, kind: kindXID, xid: 79}}},
		{"xid naming an instance on a whole GPU", nvmlEvent{gpuUUID: gpu0, eventType: nvmlEventXIDCritical, data: 31, gi: 3, ci: 0},
			[]observation{{uuid: gpu0, kind: kindXID, xid: 31}}},
		{"dbe", nvmlEvent{gpuUUID: gpu0, eventType: nvmlEventDoubleBitECC, gi: noInstance, ci: noInstance},
			[]observation{{uuid: gpu0, kind: kindDBE}}},
		{"sbe", nvmlEvent{gpuUUID: gpu0, eventType: nvmlEventSingleBitECC, gi: noInstance, ci: noInstance},
			[]observation{{uuid: gpu0, kind: kindSBE}}},
		{"other event type", nvmlEvent{gpuUUID: gpu0, eventType: 4, gi: noInstance, ci: noInstance}, nil},
		{"unwatched GPU", nvmlEvent{gpuUUID: "GPU-9", eventType: nvmlEventXIDCritical, data: 79, gi: noInstance, ci: noInstance}, nil},
		{"MIG parent whole GPU", nvmlEvent{gpuUUID: gpu1, eventType: nvmlEventXIDCritical, data: 79, gi: noInstance, ci: noInstance},
			[]observation{{uuid: "MIG-a", kind: kindXID, xid: 79}, {uuid: "MIG-b", kind: kindXID, xid: 79}}},
		{"MIG instance", nvmlEvent{gpuUUID: gpu1, eventType: nvmlEventXIDCritical, data: 94, gi: 2, ci: 0},
			[]observation{{uuid: "MIG-b", kind: kindXID, xid: 94}}},
		{"MIG other compute instance", nvmlEvent{gpuUUID: gpu1, eventType: nvmlEventXIDCritical, data: 94, gi: 2, ci: 1}, nil},
	}
	for _, tt := range tests {
		if got := translate(tt.e, byParent); !slices.Equal(got, tt.want) {
			t.Errorf("%s: translate = %+v, want %+v", tt.name, got, tt.want)
		}
	}
}
