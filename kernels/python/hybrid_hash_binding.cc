// pybind11 binding of the TF-free HybridHash store (kernels/hybrid_hash) as
// hybridtf._native.HybridHashStore: the hit-ratio benchmark and reference
// tests drive Algorithm 1 on NumPy arrays without a TensorFlow graph.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>

#include "kernels/hybrid_hash/hybrid_hash_impl.h"

namespace py = pybind11;

namespace hybridtf {
namespace {

using hybrid_hash::Config;
using hybrid_hash::Store;

using I64 = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;
using F32 = py::array_t<float, py::array::c_style | py::array::forcecast>;

void Check(const ImplStatus& status) {
  if (status.ok()) return;
  if (status.code() == ImplStatus::Code::kInvalidArgument) throw py::value_error(status.message());
  throw std::runtime_error(status.message());
}

I64 Ids(const py::array& ids) {
  const py::dtype dtype = ids.dtype();
  if (dtype.kind() != 'i' && dtype.kind() != 'u') {
    throw py::type_error("ids must be an integer array, got dtype " + std::string(py::str(dtype)) +
                         ". Hash strings into int64 ids first.");
  }
  I64 out = I64::ensure(ids);
  if (!out || out.ndim() != 1) throw py::value_error("ids must be a 1-D integer array.");
  return out;
}

std::unique_ptr<Store> Make(const std::string& name, int64_t dim, int64_t hot_rows,
                            int64_t capacity, int64_t warmup_steps, int64_t flush_every,
                            uint64_t seed, const std::string& initializer, float init_a,
                            float init_b, float count_decay, const std::string& evict_policy,
                            int64_t ttl_steps, int64_t members) {
  Config c;
  c.name = name;
  c.dim = dim;
  c.hot_rows = hot_rows;
  c.capacity = capacity;
  c.warmup_steps = warmup_steps;
  c.flush_every = flush_every;
  c.seed = seed;
  c.init_a = init_a;
  c.init_b = init_b;
  c.count_decay = count_decay;
  c.ttl_steps = ttl_steps;
  if (!hybrid_hash::ParseInitializer(initializer, &c.initializer)) {
    throw py::value_error("initializer must be zeros, constant, uniform or normal.");
  }
  if (!hybrid_hash::ParseEvictPolicy(evict_policy, &c.evict_policy)) {
    throw py::value_error("evict_policy must be 'lfu' or 'lru'.");
  }
  if (members < 1 || members > hybrid_hash::kMaxMembers) {
    throw py::value_error("members must be in [1, 2^20].");
  }
  if (members > 1) {  // a packed store: member m's rows are those of a table with seed + m
    for (int64_t m = 0; m < members; ++m) {
      c.members.push_back({seed + static_cast<uint64_t>(m), c.initializer, init_a, init_b});
    }
  }
  std::unique_ptr<Store> store;
  Check(Store::Create(c, &store));
  return store;
}

// A members array like ids (None: every id is member 0's).
I64 Members(const py::object& members, int64_t n) {
  if (members.is_none()) return I64();
  I64 out = I64::ensure(members);
  if (!out || out.ndim() != 1 || out.shape(0) != n) {
    throw py::value_error("members must be None or an integer array like ids.");
  }
  return out;
}

F32 Grad(const Store& s, const py::array& grad, int64_t n) {
  F32 g = F32::ensure(grad);
  if (!g || g.ndim() != 2 || g.shape(0) != n || g.shape(1) != s.dim()) {
    throw py::value_error("grad must be a float array [len(ids), dim].");
  }
  return g;
}

}  // namespace

void BindHybridHash(py::module_& m) {
  py::class_<Store>(m, "HybridHashStore",
                    "The TF-free HybridHash store (see kernels/hybrid_hash/hybrid_hash_impl.h).")
      .def(py::init(&Make), py::arg("name"), py::arg("dim"), py::arg("hot_rows"),
           py::arg("capacity") = 0, py::arg("warmup_steps") = 0, py::arg("flush_every") = 1,
           py::arg("seed") = 0, py::arg("initializer") = "uniform", py::arg("init_a") = -0.05f,
           py::arg("init_b") = 0.05f, py::arg("count_decay") = 1.f, py::arg("evict_policy") = "lfu",
           py::arg("ttl_steps") = 0, py::arg("members") = 1)
      .def(
          "lookup",
          [](Store& s, const py::array& ids_any, const py::object& counts_obj, bool insert,
             const py::object& members_obj) {
            I64 ids = Ids(ids_any);
            const int64_t n = ids.shape(0);
            I64 members = Members(members_obj, n);
            I64 counts;
            if (!counts_obj.is_none()) {
              counts = I64::ensure(counts_obj);
              if (!counts || counts.ndim() != 1 || counts.shape(0) != n) {
                throw py::value_error("counts must be None or an integer array like ids.");
              }
            }
            py::array_t<float> rows({n, s.dim()});
            const int64_t* c = counts_obj.is_none() ? nullptr : counts.data();
            ImplStatus status;
            {
              py::gil_scoped_release release;
              status = s.Lookup(ids.data(), c, n, insert, rows.mutable_data(), SequentialFor,
                                members_obj.is_none() ? nullptr : members.data());
            }
            Check(status);
            return rows;
          },
          py::arg("ids"), py::arg("counts") = py::none(), py::arg("insert") = true,
          py::arg("members") = py::none())
      .def(
          "apply_sgd",
          [](Store& s, const py::array& ids_any, const py::array& grad, float lr) {
            I64 ids = Ids(ids_any);
            F32 g = Grad(s, grad, ids.shape(0));
            Check(s.ApplySgd(ids.data(), g.data(), ids.shape(0), lr, SequentialFor));
          },
          py::arg("ids"), py::arg("grad"), py::arg("lr"))
      .def(
          "apply_adagrad",
          [](Store& s, const py::array& ids_any, const py::array& grad, float lr, float eps,
             float acc0, const py::object& members_obj) {
            I64 ids = Ids(ids_any);
            F32 g = Grad(s, grad, ids.shape(0));
            I64 members = Members(members_obj, ids.shape(0));
            Check(s.EnsureSlots(1, &acc0));
            Check(s.ApplyAdagrad(ids.data(), g.data(), ids.shape(0), lr, eps, SequentialFor,
                                 members_obj.is_none() ? nullptr : members.data()));
          },
          py::arg("ids"), py::arg("grad"), py::arg("lr"), py::arg("epsilon") = 1e-7f,
          py::arg("initial_accumulator_value") = 0.1f, py::arg("members") = py::none())
      .def(
          "apply_adam",
          [](Store& s, const py::array& ids_any, const py::array& grad, float alpha, float c1,
             float c2, float eps, bool lazy) {
            I64 ids = Ids(ids_any);
            F32 g = Grad(s, grad, ids.shape(0));
            const float zeros[2] = {0.f, 0.f};
            Check(s.EnsureSlots(2, zeros));
            Check(s.ApplyAdam(ids.data(), g.data(), ids.shape(0), alpha, c1, c2, eps, lazy,
                              SequentialFor));
          },
          py::arg("ids"), py::arg("grad"), py::arg("alpha"), py::arg("one_minus_beta1"),
          py::arg("one_minus_beta2"), py::arg("epsilon"), py::arg("lazy") = false)
      .def(
          "end_step", [](Store& s) { s.EndStep(); }, py::call_guard<py::gil_scoped_release>(),
          "Algorithm 1's flush check for the step that ends, then step + 1.")
      .def(
          "flush", [](Store& s) { s.Flush(); }, py::call_guard<py::gil_scoped_release>())
      .def(
          "hot_keys",
          [](const Store& s) {
            std::vector<int64_t> ids, members;
            s.HotKeys(&ids, &members);
            const auto n = static_cast<py::ssize_t>(ids.size());
            return py::make_tuple(py::array_t<int64_t>(n, ids.data()),
                                  py::array_t<int64_t>(n, members.data()));
          },
          "(ids, members) of the rows in the hot tier, in entry order.")
      .def("last_flush_candidates", &Store::LastFlushCandidates,
           "Records the last re-selecting flush compared (all, or the tier + touched ones).")
      .def("stats",
           [](const Store& s) {
             const hybrid_hash::Stats st = s.GetStats();
             int64_t v[hybrid_hash::kNumStats];
             hybrid_hash::StatsToArray(st, v);
             static const char* kNames[hybrid_hash::kNumStats] = {
                 "size",           "hot_used",    "hot_rows",
                 "inserts",        "evictions",   "lookups",
                 "hits",           "occurrences", "occurrence_hits",
                 "step",           "flushes",     "last_step_lookups",
                 "last_step_hits", "bytes",       "hot_bytes",
                 "num_slots"};
             py::dict d;
             for (int i = 0; i < hybrid_hash::kNumStats; ++i) d[kNames[i]] = v[i];
             return d;
           })
      .def("export",
           [](Store& s) {
             hybrid_hash::Snapshot snap;
             {
               py::gil_scoped_release release;
               s.Export(&snap);
             }
             const int64_t n = static_cast<int64_t>(snap.ids.size());
             py::array_t<int64_t> ids(n, snap.ids.data());
             py::array_t<float> rows({n, s.dim()}, snap.rows.data());
             py::array_t<float> slots({n, snap.num_slots, s.dim()}, snap.slots.data());
             py::array_t<int64_t> counts(n, snap.counts.data());
             py::array_t<float> slot_init(static_cast<int64_t>(snap.slot_init.size()),
                                          snap.slot_init.data());
             return py::make_tuple(ids, rows, slots, counts, slot_init, snap.step);
           })
      .def(
          "export_members",
          [](Store& s) {
            hybrid_hash::Snapshot snap;
            {
              py::gil_scoped_release release;
              s.Export(&snap);
            }
            return py::array_t<int64_t>(static_cast<py::ssize_t>(snap.members.size()),
                                        snap.members.data());
          },
          "Each exported row's member (export() order: by member, then id).")
      .def_property_readonly("dim", &Store::dim);
  m.def(
      "hybrid_hash_initial_rows",
      [](const py::array& ids_any, int64_t dim, uint64_t seed, const std::string& initializer,
         float init_a, float init_b) {
        Config c;
        c.dim = dim;
        c.seed = seed;
        c.init_a = init_a;
        c.init_b = init_b;
        c.hot_rows = 1;
        if (!hybrid_hash::ParseInitializer(initializer, &c.initializer)) {
          throw py::value_error("initializer must be zeros, constant, uniform or normal.");
        }
        Check(hybrid_hash::ValidateConfig(c));
        I64 ids = Ids(ids_any);
        py::array_t<float> rows({ids.shape(0), dim});
        hybrid_hash::InitialRows(c, ids.data(), ids.shape(0), rows.mutable_data());
        return rows;
      },
      py::arg("ids"), py::arg("dim"), py::arg("seed"), py::arg("initializer") = "uniform",
      py::arg("init_a") = -0.05f, py::arg("init_b") = 0.05f,
      "The initial rows a HybridHash table gives ids (a function of seed, id, initializer).");
}

}  // namespace hybridtf
