"""Rank discovery (``pretrain.launch``) under each launcher, and Slurm's node lists."""
from pretrain.launch import expand_hostlist, from_environment


def test_slurm_node_lists_expand():
    assert expand_hostlist("gpu[01-03,07],login1") == ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]
    assert expand_hostlist("node-a[8-10]") == ["node-a8", "node-a9", "node-a10"]
    assert expand_hostlist("solo") == ["solo"]


def test_rank_discovery_for_each_launcher():
    torchrun = from_environment({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "h0",
                                 "MASTER_PORT": "1234"})
    assert (torchrun.rank, torchrun.world_size, torchrun.local_rank, torchrun.master_addr) == (3, 8, 1, "h0")
    srun = from_environment({"SLURM_PROCID": "5", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0",
                             "SLURM_STEP_NODELIST": "gpu[12-15]", "SLURM_JOB_ID": "4242"})
    assert (srun.rank, srun.world_size, srun.local_rank, srun.master_addr, srun.master_port) == \
        (5, 16, 1, "gpu12", 20000 + 4242)
    assert srun.launcher == "srun"

    class FakeComm:
        def Get_rank(self):
            return 1

        def Get_size(self):
            return 4

        def bcast(self, value, root):
            return "10.0.0.7"

    mpi = from_environment({"PMI_SIZE": "4", "PMI_RANK": "1", "MPI_LOCALRANKID": "1"}, mpi_comm=FakeComm())
    assert (mpi.rank, mpi.world_size, mpi.local_rank, mpi.master_addr, mpi.launcher) == (1, 4, 1, "10.0.0.7", "mpi")
    single = from_environment({})
    assert (single.rank, single.world_size, single.launcher) == (0, 1, "single")
