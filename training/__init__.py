"""Pair training for the test bed (issue 73): train_pair (a target and its DFlash drafts trained together),
best_draft and offline_accept (which snapshot of a draft accepts most, offline), draft_session.sh and put_draft.sh
(a draft trained in its own device session, put over a kept target). Run from the project root as modules
(`python3 -m training.train_pair ...`)."""
