"""scripts/slurm/train.sbatch on a real two-node SLURM (the fixture slurm_cluster, tests/slurm_cluster.py)."""
import os


def test_the_cluster_runs_one_job_across_both_nodes_and_honours_gpus_per_node(slurm_cluster, tmp_path):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\nsrun bash -c 'echo $SLURMD_NODENAME $SLURM_GPUS_PER_NODE'\n")
    job = slurm_cluster.submit("--nodes=2", "--gpus-per-node=2", f"--output={tmp_path}/job.out", str(script),
                               cwd=str(tmp_path))
    assert slurm_cluster.wait(job)["JobState"] == "COMPLETED"
    assert sorted((tmp_path / "job.out").read_text().splitlines()) == ["n1 2", "n2 2"]
    assert slurm_cluster.node_addr("n2") == "127.0.0.1" and os.path.isfile(slurm_cluster.env["SLURM_CONF"])
    # a third GPU per node does not exist: SLURM refuses the job rather than queueing it for ever
    refused = slurm_cluster.command("sbatch", "--gpus-per-node=3", str(script), check=False)
    assert refused.returncode != 0 and "Requested node configuration is not available" in refused.stderr
