"""This host's processes of a job: the elastic agents (:mod:`.agent`), started ahead of the config to overlap
imports (:mod:`.prewarm`), supervised and stopped as one group per node (:mod:`.supervisor`), their workers'
deaths named (:mod:`.deathwatch`), the rendezvous port (:mod:`.ports`)."""
